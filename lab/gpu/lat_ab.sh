#!/usr/bin/env bash
# Where the 8 B D D latency goes, step by step, and binary sets compared in alternation.
# Carried binaries: one folder per set under .gpu (each with osu_latency and gpulmt-run;
# `bin` is this commit's, from prepare.sh), and .gpu/anatomy (this commit built with the
# transport's `anatomy` feature). Runs: the anchors' small-copy latency, copy_probe 8,
# each round copy_pingpong 8 B (the copy-engine ping-pong floor) and each set's
# osu_latency 8 B D D and H H in turn (ROUNDS rounds), then two anatomy runs
# (GPULMT_ANATOMY_OUT logs, lined up by bench/gpu/anatomy.py; OSU_ANATOMY beside them).
# Usage: SETS="old bin" ROUNDS=6 HRANGE=8:8 bash lab/gpu/lat_ab.sh OUTDIR   (packs OUTDIR.tgz)
# (HRANGE: the H H sizes, OSU -m; D D is always 8 B.)
# (explore10 ran it as explore10_h200x2.sh with these defaults.)
source "$(dirname "$0")/lab.sh"
sets=${SETS:-old bin}
small_copy_baselines
lat() { # set placement
  local m=8:8
  [ "$2" = H ] && m=${HRANGE:-8:8}
  ".gpu/$1/gpulmt-run" -n 2 --timeout 60 -- ".gpu/$1/osu_latency" -m "$m" -i 20000 --csv "$out/lat_$1_$2$2.csv" $2 $2 > /dev/null 2>> "$out/log.txt"
}
for i in $(seq "${ROUNDS:-6}"); do
  log round $i
  .gpu/bin/copy_pingpong -m 8:8 -i 20000 | tail -n +2 >> "$out/floor.csv" 2>> "$out/log.txt"
  for s in $sets; do lat $s D; lat $s H; done
done
for i in 1 2; do
  log anatomy $i
  OSU_ANATOMY=1 GPULMT_ANATOMY_OUT="$out/anat$i" .gpu/anatomy/gpulmt-run -n 2 --timeout 60 -- \
    .gpu/anatomy/osu_latency -m 8:8 -i 20000 D D > "$out/osu_anatomy$i.txt" 2>> "$out/log.txt"
  python3 bench/gpu/anatomy.py "$out/anat$i" > "$out/anatomy$i.csv" 2>> "$out/log.txt"
  gzip "$out/anat$i".*.csv
done
log done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
grep ce_latency "$out/anchors.csv"
echo "floor.csv $(cut -d, -f4 "$out/floor.csv" | tr '\n' ' ')"
for f in "$out"/lat_*_DD.csv; do printf '%s ' "$(basename "$f")"; tail -n +2 "$f" | cut -d, -f6 | tr '\n' ' '; echo; done
python3 - "$out" <<'PY' # H H: per set and size, the median over rounds
import csv, glob, os, statistics, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "lat_*_HH.csv"))):
    v = {}
    for r in csv.reader(open(f)):
        if r[0] != "bench": v.setdefault(int(r[3]), []).append(float(r[5]))
    print(os.path.basename(f), " ".join(f"{k}:{statistics.median(x):.3f}" for k, x in sorted(v.items())))
PY
cat "$out/anatomy1.csv" "$out/anatomy2.csv"
grep -E "ipc_pull_(memcpy_streamsync|gpulmt)|push_memcpypeer" "$out/copy_probe_8.csv"
