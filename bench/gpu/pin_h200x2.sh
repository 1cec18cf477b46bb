#!/usr/bin/env bash
# Does pinning the two ranks to cores change the 8 B D D latency? Five alternating
# runs unpinned (gpulmt-run's default) and pinned (rank r on core 2 + 2r, by taskset),
# plus the copy-and-wait anchor, on the 2-GPU host.
# Usage: bash bench/gpu/pin_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
lscpu > "$out/lscpu.txt" 2>&1
for rep in 1 2 3 4 5; do
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/unpinned.csv" D D > /dev/null
  $bin/gpulmt-run -n 2 --timeout 60 -- sh -c 'exec taskset -c $((2 + 2 * GPULMT_RANK)) '"$bin"'/osu_latency -m 8:8 -i 20000 --csv '"$out"'/pinned.csv D D' > /dev/null
done
for f in unpinned pinned; do echo "$f: $(grep ',8,' "$out/$f.csv" | cut -d, -f6 | tr '\n' ' ')"; done | tee "$out/summary.txt"
