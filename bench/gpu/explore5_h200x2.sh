#!/usr/bin/env bash
# Session 5, second exploration on the 2-GPU host: (1) the overlap check (stencil_overlap.sh,
# 3 x 400 steps) with the overlap mode's host-side wait for the comm queue, plus one
# --timeline pass; (2) osu_latency D D 8 B with OSU_ANATOMY=1, unpinned and pinned
# (taskset), three runs each, and the copy-and-wait anchor.
# Usage: bash bench/gpu/explore5_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/stencil_overlap.sh "$out" 3 400
for p in single double; do for h in 1 4; do for m in "1 inter-k" "2 inter-k-overlap"; do
  set -- $m
  $bin/gpulmt-run -n $1 --timeout 120 -- $bin/stencil2d --size 4096 --halo $h --precision $p --mode $2 --iters 400 --timeline 2>&1 | grep "^timeline" | sed "s|^|$p h$h :: |" >> "$out/timeline.txt"
done; done; done
for rep in 1 2 3; do
  OSU_ANATOMY=1 $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/lat_unpinned.csv" D D | grep anatomy | sed "s/^/unpinned,$rep,/" >> "$out/anatomy.csv"
  OSU_ANATOMY=1 $bin/gpulmt-run -n 2 --timeout 60 -- sh -c 'exec taskset -c $((2 + 2 * GPULMT_RANK)) '"$bin"'/osu_latency -m 8:8 -i 20000 --csv '"$out"'/lat_pinned.csv D D' | grep anatomy | sed "s/^/pinned,$rep,/" >> "$out/anatomy.csv"
done
echo "== stencil (medians come from bench-report; raw rows)"; $bin/bench-report "$out" 2>&1 | tail -15
echo "== timeline"; sed 's/ over .* batches, us after the batch.s start on the GPU//' "$out/timeline.txt"
echo "== latency"; for f in unpinned pinned; do echo "$f: $(grep ',8,' "$out/lat_$f.csv" | cut -d, -f6 | tr '\n' ' ')"; done
echo "== anatomy (pinned run 1)"; grep "^pinned,1," "$out/anatomy.csv"
