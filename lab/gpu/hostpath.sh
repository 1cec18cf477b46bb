#!/usr/bin/env bash
# The host path alone, on the GPU host's CPUs: the sim backend with inline copies
# (GPULMT_SIM_COPY=inline, a zero-time copy engine), so a leg of an 8 B D D ping-pong is
# what gpulmt's protocols and rings cost, and copy_pingpong on the same setting is the
# floor (a shared-memory word per leg). Each round runs the floor, then each binary set's
# osu_latency 8 B D D and H H, and where the set has it, hostpath_cost (both ranks in one
# thread: the CPU cost of a leg, without cross-core latencies; best of 5 repetitions).
# Sets: folders under .gpu with osu_latency and gpulmt-run.
# Usage: SETS="base bin" ROUNDS=6 bash lab/gpu/hostpath.sh OUTDIR
source "$(dirname "$0")/lab.sh"
export GPULMT_DEVICE=sim GPULMT_SIM_COPY=inline
sets=${SETS:-bin}
for i in $(seq "${ROUNDS:-6}"); do
  .gpu/bin/copy_pingpong -m 8:8 -i 200000 | tail -n +2 >> "$out/host_floor.csv" 2>> "$out/log.txt"
  for s in $sets; do
    for p in D H; do
      ".gpu/$s/gpulmt-run" -n 2 --timeout 60 -- ".gpu/$s/osu_latency" -m 8:8 -i 200000 --csv "$out/host_${s}_$p$p.csv" $p $p > /dev/null 2>> "$out/log.txt"
      if [ -x ".gpu/$s/hostpath_cost" ]; then
        taskset -c 2 ".gpu/$s/hostpath_cost" -m 8:8 -i 200000 --reps 5 $p $p 2>> "$out/log.txt" | tail -n +2 >> "$out/cost_${s}_$p$p.csv"
      fi
    done
  done
done
python3 - "$out" <<'PY'
import csv, glob, os, statistics, sys
d = sys.argv[1]
def show(name, vals):
    print(f"{name:24s} median {statistics.median(vals):.3f}  " + " ".join(f"{v:.3f}" for v in vals))
show("host_floor (copy_pingpong)", [float(r[3]) for r in csv.reader(open(os.path.join(d, "host_floor.csv")))])
for f in sorted(glob.glob(os.path.join(d, "host_*_*.csv"))):
    show(os.path.basename(f)[:-4], [float(r[5]) for r in csv.reader(open(f)) if r[0] != "bench"])
for f in sorted(glob.glob(os.path.join(d, "cost_*_*.csv"))):
    show(os.path.basename(f)[:-4] + " (ns)", [float(r[3]) for r in csv.reader(open(f))])
PY
