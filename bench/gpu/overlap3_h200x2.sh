#!/usr/bin/env bash
# The overlap check (stencil_overlap.sh, 3 x 400 steps) with the two-exchange warm-up that
# opens both arrays' peer mappings before timing, the overlap mode's --check runs, and one
# --host-intervals run per precision at halo width 1 (its report counts the mappings opened
# while timed).
# Usage: bash bench/gpu/overlap3_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/stencil_overlap.sh "$out" 3 400
bash bench/gpu/stencil_overlap_check.sh "$out"
for p in single double; do
  $bin/gpulmt-run -n 2 --timeout 120 -- $bin/stencil2d --size 4096 --halo 1 --precision $p --mode inter-k-overlap --iters 400 --host-intervals \
    > "$out/intervals_$p.txt" 2>&1
done
$bin/bench-report "$out" > "$out/report.md" 2>&1
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== stencil overlap"; grep -A9 "overlap against compute alone" "$out/report.md" | tail -5
echo "== checks"; cut -c1-70 "$out/check.txt"
echo "== intervals"; grep -h "host intervals\|timed steps\|^summary" "$out"/intervals_*.txt | cut -c1-200
