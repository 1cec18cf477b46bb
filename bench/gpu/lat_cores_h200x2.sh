#!/usr/bin/env bash
# Which cores suit the busy-polling ranks: osu_latency D D 8 B with the two ranks pinned
# (taskset, launcher binding off) to CPUs 0+1 (the launcher's default), 2+3, 16+17 and
# 30+31, ROUNDS rotated rounds. Rows `cpus,latency_us` in OUTDIR/lat_cores.csv.
# Usage: bash bench/gpu/lat_cores_h200x2.sh OUTDIR [ROUNDS=5]   (after prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
rounds=${2:-5}
pairs=("0 1" "2 3" "16 17" "30 31")
echo "cpus,latency_us" > "$out/lat_cores.csv"
for r in $(seq "$rounds"); do
  for k in 0 1 2 3; do
    set -- ${pairs[$(( (k + r) % 4 ))]}
    a=$1 b=$2
    rm -f /tmp/lat.csv
    $bin/gpulmt-run -n 2 --bind none --timeout 60 -- sh -c "exec taskset -c \$([ \$GPULMT_RANK = 0 ] && echo $a || echo $b) $bin/osu_latency -m 8:8 -i 20000 --csv /tmp/lat.csv D D" > /dev/null 2>> "$out/err.txt"
    echo "$a+$b,$(grep ',8,us,' /tmp/lat.csv | cut -d, -f6)" >> "$out/lat_cores.csv"
  done
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
for p in 0+1 2+3 16+17 30+31; do echo "$p: $(grep "^$p," "$out/lat_cores.csv" | cut -d, -f2 | sort -n | tr '\n' ' ')"; done
