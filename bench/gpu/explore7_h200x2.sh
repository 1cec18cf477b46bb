#!/usr/bin/env bash
# Session 5, fourth exploration: (1) the overlap check (stencil_overlap.sh, 3 x 400 steps)
# with the pipelined overlap mode (no host wait on the compute queue in one-step batches),
# plus --check runs of the overlap mode on 2 ranks (h1, h4, both precisions) and 4 ranks
# (2x2 grid, two per GPU, h1 and h2); (2) the shim's host latency (hostlat_h200x2.sh) with
# the new fast path; (3) osu_latency D D 8 B, three runs.
# Usage: bash bench/gpu/explore7_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/stencil_overlap.sh "$out" 3 400
bash bench/gpu/stencil_overlap_check.sh "$out"
bash bench/gpu/hostlat_h200x2.sh "$out/hostlat" > /dev/null 2>&1
for rep in 1 2 3; do
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/lat.csv" D D > /dev/null
done
echo "== stencil overlap"; $bin/bench-report "$out" 2>&1 | grep -A8 "overlap against compute alone"
echo "== checks"; cat "$out/check.txt"
echo "== host latency (us)"; for v in plain plain_2comms shim; do echo "$v: $(grep "^$v," "$out/hostlat/hostlat.csv" | cut -d, -f4 | tr '\n' ' ')"; done
echo "== latency 8 B"; grep ',8,' "$out/lat.csv" | cut -d, -f6 | tr '\n' ' '; echo
