#!/usr/bin/env bash
# With gpulmt-run binding ranks to cores (its new default): the 34 correctness checks
# (run_h200x2.sh quick), the 8 B D D latency five times, and the Stencil2D overlap check
# (stencil_overlap.sh, 2 x 400 steps).
# Usage: bash bench/gpu/bound_checks_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/run_h200x2.sh quick "$out" > /dev/null 2>> "$out/log.txt"
for i in 1 2 3 4 5; do
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/lat8.csv" D D > /dev/null 2>> "$out/log.txt"
done
bash bench/gpu/stencil_overlap.sh "$out" 2 400
$bin/bench-report "$out" > "$out/report.md" 2>> "$out/log.txt"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== checks: $(grep -c ',ok' "$out/check.csv") ok"; grep FAIL "$out/check.csv"
echo "== latency 8 B: $(cut -d, -f6 "$out/lat8.csv" | grep -v value | tr '\n' ' ')"
grep -A9 "overlap against compute alone" "$out/report.md" | tail -5
