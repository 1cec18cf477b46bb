#!/usr/bin/env python3
"""The table of lab/gpu/net_push.sh's run: per size, osu_latency D D and H H across 2
pseudo-nodes for each variant (old, cts, push; each round's value, rounds in
alternation), the host-staged anchor and Open MPI's H H beside them, the ratio of the
pushed D D latency to the anchor (issue 27's target: <= 1 at every size), the copy
server's small sizes, and osu_bw D D / H H against Open MPI's H H (target: D D >= 0.9
at >= 4 MiB).

Usage: net_push_summary.py OUTDIR   (a text table on standard output)
"""
import csv
import glob
import os
import re
import sys

SIZES = [8, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
VARIANTS = ["old", "cts", "push"]


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(l for l in f if "," in l))


def osu(path):
    """bytes -> value (us, or GB/s for bandwidth) of one gpulmt osu CSV."""
    out = {}
    for r in rows(path):
        v = float(r["value"])
        out[int(r["bytes"])] = v / 1000.0 if r["metric"] == "MBps" else v
    return out


def anchor(path, metric):
    return {int(r["bytes"]): float(r["value"]) for r in rows(path) if r["metric"] == metric}


def show(v):
    return "-" if v is None else f"{v:.2f}"


def size_name(n):
    for unit, s in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{s}"
    return str(n)


def main(out):
    rounds = sorted({int(m.group(1)) for p in glob.glob(f"{out}/lat_*_*_*.csv")
                     if (m := re.search(r"lat_[a-z]+_(\d+)_", p))})
    lat = {(v, r, pl): osu(f"{out}/lat_{v}_{r}_{pl}.csv") for v in VARIANTS for r in rounds for pl in ("DD", "HH")}
    staged = anchor(f"{out}/staged_mpi.csv", "half_rtt_us")
    host = anchor(f"{out}/host_mpi.csv", "half_rtt_us")
    host_bw = anchor(f"{out}/host_mpi.csv", "GBps")
    for pl, name in (("DD", "D D"), ("HH", "H H")):
        print(f"## osu_latency {name} across 2 pseudo-nodes, us (rounds {', '.join(map(str, rounds))} each)")
        head = ["bytes"] + [f"{v}" for v in VARIANTS] + ["staged anchor" if pl == "DD" else "Open MPI H H"]
        head += ["push / anchor (best round)"] if pl == "DD" else []
        print(" | ".join(head))
        for n in SIZES:
            cells = [size_name(n)]
            for v in VARIANTS:
                cells.append(" / ".join(show(lat[(v, r, pl)].get(n)) for r in rounds))
            ref = (staged if pl == "DD" else host).get(n)
            cells.append(show(ref))
            if pl == "DD":
                best = min((lat[("push", r, pl)][n] for r in rounds if n in lat[("push", r, pl)]), default=None)
                cells.append(show(best / ref if best is not None and ref else None))
            print(" | ".join(cells))
        print()
    server = {v: osu(f"{out}/lat_server_{v}.csv") for v in ("cts", "push")}
    print("## osu_latency D D with the copy server (GPULMT_COPY_SERVER_MAX=64K), us")
    print("bytes | cts | push | staged anchor | push / anchor")
    for n in [s for s in SIZES if s <= 65536]:
        p, a = server["push"].get(n), staged.get(n)
        print(f"{size_name(n)} | {show(server['cts'].get(n))} | {show(p)} | {show(a)} | {show(p / a if p and a else None)}")
    print()
    print("## osu_bw across 2 pseudo-nodes, GB/s, beside Open MPI's own H H")
    print("bytes | D D cts | D D push | H H cts | H H push | Open MPI H H | D D push / Open MPI")
    bw = {(v, pl): osu(f"{out}/bw_{v}_{pl}.csv") for v in ("cts", "push") for pl in ("DD", "HH")}
    for n in [s for s in SIZES if s >= 4 << 20]:
        p, h = bw[("push", "DD")].get(n), host_bw.get(n)
        cells = [show(bw[(v, pl)].get(n)) for pl in ("DD", "HH") for v in ("cts", "push")]
        print(f"{size_name(n)} | " + " | ".join(cells) + f" | {show(h)} | {show(p / h if p and h else None)}")
    if os.path.exists(f"{out}/sleep_cost.txt"):
        print()
        print(open(f"{out}/sleep_cost.txt").read().strip())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
