#!/usr/bin/env bash
# Session 6, second exploration: where Stencil2D's overlap mode still loses 2-3 us a step
# at halo width 1. Each run prints, per rank, the distribution of host-side batch intervals
# and exchange times (--host-intervals): a device that is steadily slower shows as a
# shifted median, a host that is sometimes late as a long tail. 3 x 400 steps at 4096^2,
# single and double: one rank computing alone, two ranks inter-k-overlap (auto, i.e.
# GET; and PUT), and two ranks with --no-exchange (the overlap structure without messages).
# Usage: bash bench/gpu/explore9_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
st() {
  tag=$1; n=$2; shift 2
  $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d --size 4096 --halo 1 --iters 400 --host-intervals "$@" > /tmp/st.txt 2>&1 \
    || { echo "FAILED: $tag" >&2; tail -3 /tmp/st.txt >&2; }
  sed -n "s/^host intervals: /$tag: /p" /tmp/st.txt >> "$out/intervals.txt"
  grep "^summary:" /tmp/st.txt | cut -d"|" -f1 | sed "s/^/$tag: /" >> "$out/steps.txt"
  cp /tmp/st.txt "$out/last_$tag.txt"
}
for rep in 1 2 3; do for p in single double; do
  st "$p,compute" 1 --precision $p --mode inter-k --csv "$out/stencil.csv"
  st "$p,overlap_get" 2 --precision $p --mode inter-k-overlap --csv "$out/stencil.csv"
  st "$p,overlap_put" 2 --precision $p --mode inter-k-overlap --protocol put
  st "$p,overlap_noexchange" 2 --precision $p --mode inter-k-overlap --no-exchange
  st "$p,interk" 2 --precision $p --mode inter-k --csv "$out/stencil.csv"
done; done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
cut -c1-250 "$out/intervals.txt" | sed 's/ over 399 batches, us://' | sort | sed 's/inter-k-overlap/ov/; s/inter-k/ik/'
echo "== time per step"; sort "$out/steps.txt" | cut -c1-120
