#!/usr/bin/env python3
"""The memory kinds' summary (bench/gpu/kinds.sh OUTDIR): per kind of device memory, osu_bw
(GB/s) and osu_latency (us) D D, the median over the rounds, and its ratio to legacy
(cudaMalloc) memory measured in the same rounds; legacy memory forced through the SHM path
beside the host's pinned staging ceiling (bench/gpu/pinned_staging.py's `staging` rows: the smaller of its
device-to-host and host-to-device figures, since the SHM path makes both copies); the checks.

Usage: python3 bench/gpu/kinds_summary.py OUTDIR
"""

import csv
import os
import statistics
import sys

BW_SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
LAT_SIZES = [8, 4096, 65536, 1 << 20, 4 << 20]


def rows(path):
    """kind -> bytes -> [values], from kinds.sh's `kind,round,bench,...` lines."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 8 or parts[2] == "bench":
                continue
            kind, _round, _bench, _place, _proto, nbytes, metric, value = parts[:8]
            v = float(value)
            if metric == "MBps":
                v /= 1000.0
            out.setdefault(kind, {}).setdefault(int(nbytes), []).append(v)
    return out


def median(d, kind, n):
    vs = d.get(kind, {}).get(n)
    return statistics.median(vs) if vs else None


def size_name(n):
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def cell(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def ratio(a, b):
    return None if a is None or not b else a / b


def table(title, d, sizes, unit):
    kinds = [k for k in ["legacy", "pool", "pool-ipc", "vmm-ipc", "managed", "legacy-shm"] if k in d]
    print(f"## {title} ({unit}; in brackets: / legacy in the same rounds)")
    print("| kind | " + " | ".join(size_name(n) for n in sizes) + " |")
    print("| --- |" + " ---: |" * len(sizes))
    for k in kinds:
        cells = []
        for n in sizes:
            v, base = median(d, k, n), median(d, "legacy", n)
            r = ratio(v, base)
            cells.append(cell(v) + ("" if k == "legacy" or r is None else f" ({r:.2f})"))
        print(f"| {k} | " + " | ".join(cells) + " |")
    print()


def main(out):
    bw, lat = rows(os.path.join(out, "kinds_bw.csv")), rows(os.path.join(out, "kinds_lat.csv"))
    table("osu_bw D D", bw, BW_SIZES, "GB/s")
    table("osu_latency D D", lat, LAT_SIZES, "us")
    staging = {}
    path = os.path.join(out, "anchors.csv")
    if os.path.exists(path):
        with open(path) as f:
            for r in csv.DictReader(l for l in f if "," in l):
                if r.get("anchor") == "staging":
                    staging.setdefault(int(r["bytes"]), {})[r["metric"]] = float(r["value"])
    print("## The SHM path against the pinned staging ceiling (GB/s)")
    print("| bytes | legacy through SHM | pool (staged) | managed (staged) | staging ceiling | SHM / ceiling | pool / ceiling | managed / ceiling |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in BW_SIZES:
        ceil = min(staging.get(n, {}).values()) if staging.get(n) else None
        shm, pool, man = median(bw, "legacy-shm", n), median(bw, "pool", n), median(bw, "managed", n)
        print(
            f"| {size_name(n)} | {cell(shm)} | {cell(pool)} | {cell(man)} | {cell(ceil)} | "
            f"{cell(ratio(shm, ceil), '{:.2f}')} | {cell(ratio(pool, ceil), '{:.2f}')} | {cell(ratio(man, ceil), '{:.2f}')} |"
        )
    print()
    path = os.path.join(out, "check.csv")
    if os.path.exists(path):
        lines = open(path).read().split()
        ok = sum(1 for l in lines if l.endswith(",ok"))
        bad = [l for l in lines if l.endswith(",FAIL")]
        print(f"## Checks: {ok} ok, {len(bad)} failed")
        for l in lines:
            if l.startswith(("shim_", "plain_")) or l in bad:
                print(f"- {l}")


if __name__ == "__main__":
    main(sys.argv[1])
