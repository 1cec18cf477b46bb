#!/usr/bin/env python3
"""The osu_latency rounds of a lab call side by side: one row per size, the host-staged
anchor (staged_mpi.csv) and, per build and placement, every round's time (us).

Usage: lat_table.py DIR   (reads DIR/staged_mpi.csv and DIR/lat_<build>_<round>_<placement>.csv,
as lab/gpu/net_trace.sh writes them)
"""
import collections
import csv
import glob
import sys

d = sys.argv[1]
anchor = {int(r["bytes"]): float(r["value"]) for r in csv.DictReader(open(f"{d}/staged_mpi.csv"))
          if r["metric"] == "half_rtt_us"}
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(f"{d}/lat_*.csv")):
    build, _round, placement = f.split("/")[-1][4:-4].rsplit("_", 2)
    for row in csv.DictReader(open(f)):
        runs[(build, placement)][int(row["bytes"])].append(float(row["value"]))
keys = sorted(runs)
print("bytes anchor " + " ".join(f"{b}:{pl}" for b, pl in keys))
for s in sorted({s for v in runs.values() for s in v}):
    print(s, anchor.get(s, "-"), " ".join("/".join(f"{x:.1f}" for x in runs[k][s]) for k in keys))
