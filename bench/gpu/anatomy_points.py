"""The anatomy's point and probe numbers, read from transport/src/anatomy.rs, where they are
defined (`enum Point` and `mod probe`), so that the scripts lining up the logs
(anatomy.py, anatomy_net.py, lab/gpu/anatomy_trace.py) never carry a copy of them.

POINT maps a `Point` variant's name to its number (POINT["SendPost"] == 1); PROBE maps a
`probe` constant's name to its arg (PROBE["COPY_WAIT_DONE"] == 11). A point that a script
names and anatomy.rs no longer has fails at import, with the name, instead of matching
nothing.
"""
import os
import re

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "transport", "src", "anatomy.rs")


def _parse(text):
    enum = re.search(r"pub enum Point \{(.*?)\n\}", text, re.S)
    probes = re.search(r"pub mod probe \{(.*?)\n\}", text, re.S)
    if not enum or not probes:
        raise SystemExit(f"{SOURCE}: no `pub enum Point` or `pub mod probe` found; update {__file__}")
    point = {m[1]: int(m[2]) for m in re.finditer(r"^\s*(\w+) = (\d+),", enum[1], re.M)}
    probe = {m[1]: int(m[2]) for m in re.finditer(r"pub const (\w+): u8 = (\d+);", probes[1])}
    return point, probe


with open(SOURCE) as _f:
    POINT, PROBE = _parse(_f.read())
