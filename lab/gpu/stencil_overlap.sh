#!/usr/bin/env bash
# Stencil2D's overlap check at 4096^2 per rank, repeated (one run's 200-step average
# spreads by several microseconds, as much as what overlapping still loses): for each
# precision and halo width 1 and 4, one rank computing alone, then 2 ranks inter-k
# and inter-k-overlap; REPS times ITERS steps, rows appended to OUTDIR/stencil.csv.
# Usage: bash lab/gpu/stencil_overlap.sh OUTDIR [REPS=3] [ITERS=400]   (binaries in .gpu/bin)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?outdir}"
reps=${2:-3}
iters=${3:-400}
st() { n=$1; shift; $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" > /tmp/stencil.txt 2>&1 || { echo "FAILED: -n $n $*" >&2; tail -3 /tmp/stencil.txt >&2; }; }
for rep in $(seq "$reps"); do for p in single double; do for h in 1 4; do
  st 1 --size 4096 --halo "$h" --precision "$p" --mode inter-k --iters "$iters" --csv "$out/stencil.csv"
  for m in inter-k inter-k-overlap; do
    st 2 --size 4096 --halo "$h" --precision "$p" --mode "$m" --iters "$iters" --csv "$out/stencil.csv"
  done
done; done; done
