#!/usr/bin/env python3
"""The internode mode's summary (bench/gpu/run.sh internode OUTDIR): per transport (Open
MPI's shared memory `vader`, and `tcp`), gpulmt's osu_latency / osu_bw / osu_bibw across
two pseudo-nodes, D D and H H, beside Open MPI H H (`host_mpi`) and the host-staged anchor
(`staged_mpi`) measured in the same call, as the issue's ratios:
- D D bandwidth / Open MPI H H bandwidth on the same transport (target >= 0.9 at >= 4 MiB),
  beside the ceiling of any staging pipeline there: a hand-written one's D D bandwidth
  (`staging_ceiling`, bench/gpu/staging_ceiling.cu, at 4 MiB) and its own ratio;
- D D latency / host-staged latency (target <= 1 at every size), and D D latency with the
  proxy never sleeping when idle (GPULMT_NET_IDLE_SLEEP=0; shared memory only);
then the checks (check.csv's internode_ lines) and the 8 B D D leg's anatomy.

Usage: internode_summary.py OUTDIR   (prints a text table; run.sh writes it to
internode_summary.txt). A missing file shows as `-` in its columns and is named below
the table.
"""
import csv
import os
import sys

SIZES = [8, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def read(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return [r for r in csv.DictReader(l for l in f if "," in l)]


def points(rows):
    """(bench, placement, bytes) -> value of gpulmt's osu CSV (bandwidth in GB/s)."""
    out = {}
    for r in rows or []:
        v = float(r["value"])
        if r["metric"] == "MBps":
            v /= 1000.0
        out[(r["bench"], r["placement"], int(r["bytes"]))] = v
    return out


def anchor(rows, name, metric):
    return {int(r["bytes"]): float(r["value"]) for r in rows or [] if r["anchor"] == name and r["metric"] == metric}


def cell(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def size_name(n):
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def transport_table(out, t, missing):
    rows = read(os.path.join(out, f"internode_{t}.csv"))
    host = read(os.path.join(out, f"host_mpi_{t}.csv"))
    staged = read(os.path.join(out, f"staged_mpi_{t}.csv"))
    ceiling_rows = read(os.path.join(out, f"staging_ceiling_{t}.csv"))
    for name, r in ((f"internode_{t}.csv", rows), (f"host_mpi_{t}.csv", host), (f"staged_mpi_{t}.csv", staged),
                    (f"staging_ceiling_{t}.csv", ceiling_rows)):
        if r is None:
            missing.append(name)
    p = points(rows)
    host_lat, host_bw = anchor(host, "host_mpi", "half_rtt_us"), anchor(host, "host_mpi", "GBps")
    staged_lat = anchor(staged, "staged_mpi", "half_rtt_us")
    ceiling = {int(r["size"]): float(r["GBps"]) for r in ceiling_rows or [] if r["mode"] == "dd"}
    head = [
        "bytes", "DD lat us", "HH lat us", "staged lat us", "DD/staged lat",
        "DD bw GB/s", "HH bw GB/s", "ompi HH bw GB/s", "DD/ompi bw",
        "staging ceiling GB/s", "ceiling/ompi bw", "DD/ceiling bw", "DD bibw GB/s", "HH bibw GB/s",
    ]
    lines = [f"## {t}: 2 pseudo-nodes, 1 rank each", " | ".join(head)]
    for n in SIZES:
        dd_lat, hh_lat = p.get(("osu_latency", "D D", n)), p.get(("osu_latency", "H H", n))
        dd_bw, hh_bw = p.get(("osu_bw", "D D", n)), p.get(("osu_bw", "H H", n))
        vals = [
            size_name(n), cell(dd_lat), cell(hh_lat),
            cell(staged_lat.get(n)), cell(ratio(dd_lat, staged_lat.get(n))),
            cell(dd_bw), cell(hh_bw), cell(host_bw.get(n)), cell(ratio(dd_bw, host_bw.get(n))),
            cell(ceiling.get(n)), cell(ratio(ceiling.get(n), host_bw.get(n))), cell(ratio(dd_bw, ceiling.get(n))),
            cell(p.get(("osu_bibw", "D D", n))), cell(p.get(("osu_bibw", "H H", n))),
        ]
        lines.append(" | ".join(vals))
    if host_lat.get(8) is not None:
        lines.append(f"Open MPI H H 8 B latency on {t}: {host_lat[8]:.2f} us")
    return lines


def main():
    out = sys.argv[1]
    missing = []
    lines = ["# The internode path on one GPU (bench/gpu/run.sh internode)", ""]
    for t in ("vader", "tcp"):
        lines += transport_table(out, t, missing) + [""]
    lines.append("Targets: DD/ompi bw >= 0.9 at >= 4M; DD/staged lat <= 1 at every size. The staging ceiling is a")
    lines.append("hand-written pipeline's D D bandwidth (no gpulmt): where ceiling/ompi is below 0.9, no staging design meets it.")
    checks = [l.strip() for l in open(os.path.join(out, "check.csv"))] if os.path.exists(
        os.path.join(out, "check.csv")) else []
    checks = [c for c in checks if c.startswith("internode")]
    lines += ["", "## checks"] + (checks or ["(none ran)"])
    anat = os.path.join(out, "anatomy_net.csv")
    lines += ["", "## one 8 B D D leg across the nodes (anatomy_net.csv: step, median us after the post)"]
    lines += [l.rstrip() for l in open(anat)] if os.path.exists(anat) else ["(missing)"]
    if missing:
        lines += ["", "missing: " + ", ".join(missing)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
