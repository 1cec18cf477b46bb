#!/usr/bin/env bash
# GPULMT_COPY_PRIORITY=high against normal on this host, in one call: server_probe's engine
# and engine_hi rows (with two GPUs also push and pull between them), then ROUNDS rotated
# rounds of osu_latency D D (8 B - 64 KiB), osu_bw D D (64 KiB - 4 MiB) and Stencil2D with
# its exchange overlapped (SIZES per rank, two ranks) at each priority, and a table of
# medians. On one GPU the two ranks share it (MPS=1 starts MPS): there `auto` is already
# high (h200x1/priority1-5, in git history). On 2x H200 each rank has its own GPU, where
# `auto` is normal because nothing showed a gain there yet: this is the call that would.
# SIZES=none leaves Stencil2D out; BW sets osu_bw's sizes (default 64K:4M).
# Usage: [ROUNDS=3] [MPS=1] [SIZES="2048 4096"|none] [BW=64K:4M] bash lab/gpu/copy_priority.sh OUTDIR
source "$(dirname "$0")/lab.sh"
nvidia-smi > "$out/host.txt" 2>&1
log server_probe
$bin/server_probe 8 65536 > "$out/server_probe.csv" 2>> "$out/log.txt"
start_mps
echo "mps=$mps gpus=$(nvidia-smi -L | wc -l)" > "$out/env.txt"
echo "variant,round,bench,bytes,metric,value" > "$out/osu.csv"
echo "variant,round,size,time_per_iter_us" > "$out/stencil.csv"
priority_variant() { # name round envs
  local v=$1 r=$2 e=$3 s
  osu_rows "$v" "$r" "$e" "$out/osu.csv" osu_latency -m 1:64K -i 10000
  osu_rows "$v" "$r" "$e" "$out/osu.csv" osu_bw -m "${BW:-64K:4M}"
  [ "${SIZES:-}" = none ] && return
  for s in ${SIZES:-2048 4096}; do
    rm -f /tmp/prio.csv
    env $e $bin/gpulmt-run -n 2 --timeout 120 -- $bin/stencil2d --size "$s" --halo 1 --mode inter-k-overlap \
      --iters 500 --csv /tmp/prio.csv > /tmp/prio.txt 2>&1 || { echo "FAILED: stencil $v $s" >> "$out/log.txt"; tail -3 /tmp/prio.txt >> "$out/log.txt"; }
    echo "$v,$r,$s,$(grep ",time_per_iter_us," /tmp/prio.csv | cut -d, -f8)" >> "$out/stencil.csv"
  done
}
rotated_rounds "normal:GPULMT_COPY_PRIORITY=normal high:GPULMT_COPY_PRIORITY=high" priority_variant 3
stop_mps
log done
grep -E "engine" "$out/server_probe.csv" | cut -d, -f2-3
# osu medians per priority: the rows have `bytes` where median_table wants `size`.
sed '1s/bytes/size/' "$out/osu.csv" | grep -E "^variant|,osu_latency," > /tmp/prio_lat.csv
sed '1s/bytes/size/' "$out/osu.csv" | grep -E "^variant|,osu_bw," > /tmp/prio_bw.csv
{ echo "osu_latency us"; median_table /tmp/prio_lat.csv value; echo "osu_bw MB/s"; median_table /tmp/prio_bw.csv value
  [ "${SIZES:-}" = none ] || { echo "Stencil2D inter-k-overlap us/step"; median_table "$out/stencil.csv" time_per_iter_us; }
} | tee "$out/table.txt"
