#!/usr/bin/env bash
# One reference call on the 2-GPU host (about 7 minutes): the full OSU-style run with its
# anchors and correctness checks (run_h200x2.sh full), the Stencil2D table
# (stencil_h200x2.sh), the PMPI shim (shim_h200x2.sh), the 8 B D D latency five more
# times (its run-to-run spread is as large as the distance to its target), each beside
# the copy-engine ping-pong floor (copy_pingpong, floor8.csv), then
# bench-report, and everything packed into OUTDIR.tgz.
# Usage: bash bench/gpu/all_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
log() { echo "== $(date +%T) $*" | tee -a "$out/run.log" >&2; }
cat .gpu/commit > "$out/commit.txt"
log full run
bash bench/gpu/run_h200x2.sh full "$out" 2>> "$out/run.log"
log 8 B latency, five more runs, each beside the floor
for i in 1 2 3 4 5; do
  $bin/copy_pingpong -m 8:8 -i 20000 2>> "$out/run.log" | tail -n +2 >> "$out/floor8.csv"
  GPULMT_DEVICE=cuda $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/lat8.csv" D D > /dev/null 2>> "$out/run.log"
done
log stencil
STENCIL_ITERS=200 bash bench/gpu/stencil_h200x2.sh "$out" 2>> "$out/run.log"
log shim
bash bench/gpu/shim_h200x2.sh "$out" > /dev/null 2>&1
log report
$bin/bench-report "$out" > "$out/report.md" 2>> "$out/run.log"
log done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
