#!/usr/bin/env bash
# Stencil2D's overlap mode against the single-rank CPU reference (--check) on the 2-GPU
# host: 2 ranks at halo width 1 and 4 in both precisions, and 4 ranks on a 2x2 grid (two
# per GPU) at halo width 1 and 2. One line per run in OUTDIR/check.txt.
# Usage: bash lab/gpu/stencil_overlap_check.sh OUTDIR   (binaries in .gpu/bin)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?outdir}"
: > "$out/check.txt"
for p in single double; do for h in 1 4; do
  $bin/gpulmt-run -n 2 --timeout 120 -- $bin/stencil2d --size 2048 --halo $h --precision $p --mode inter-k-overlap --iters 100 --check 2>&1 | grep "^check" | sed "s|^|2 ranks $p h$h: |" >> "$out/check.txt"
done; done
for h in 1 2; do
  $bin/gpulmt-run -n 4 --timeout 120 -- $bin/stencil2d --size 1024 --halo $h --mode inter-k-overlap --iters 100 --check 2>&1 | grep "^check" | sed "s|^|4 ranks single h$h: |" >> "$out/check.txt"
done
