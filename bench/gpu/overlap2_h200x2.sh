#!/usr/bin/env bash
# The overlap check again (stencil_overlap.sh, 3 x 400 steps) with thin boundary strips
# launched in one-row blocks, and the overlap mode's --check runs.
# Usage: bash bench/gpu/overlap2_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/stencil_overlap.sh "$out" 3 400
bash bench/gpu/stencil_overlap_check.sh "$out"
echo "== stencil overlap"; $bin/bench-report "$out" 2>&1 | grep -A9 "overlap against compute alone" | tail -5
echo "== checks"; cut -c1-60 "$out/check.txt"
