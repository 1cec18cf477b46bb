#!/usr/bin/env bash
# GET vs PUT vs COOPERATE vs auto at 64 KiB .. 4 MiB, where one osu_bw run per protocol
# (the harness's protocols.csv) spreads by 5-25 % between runs of the same protocol:
# REPS rounds, each running the four in a rotated order (osu_bw, then osu_latency 8 B),
# every run's rows appended to OUTDIR/gpulmt.csv; bench-report's protocols.csv then holds
# each cell's median. Prints that table and the 8 B latencies per protocol, sorted.
# RUN_FLAGS adds launcher options (e.g. "--bind none").
# Usage: bash lab/gpu/protocols_repeat.sh OUTDIR [REPS=5]   (binaries in .gpu/bin)
source "$(dirname "$0")/lab.sh"
reps=${2:-5}
run="$bin/gpulmt-run -n 2 ${RUN_FLAGS:-} --timeout 120 --"
order=(auto get put coop)
for rep in $(seq "$reps"); do
  for k in 0 1 2 3; do
    p=${order[$(( (k + rep) % 4 ))]}
    $run $bin/osu_bw -m 64K:4M --csv "$out/gpulmt.csv" --protocol "$p" D D > /dev/null 2>> "$out/repeat.err"
    $run $bin/osu_latency -m 8:8 -i 20000 --csv "$out/gpulmt.csv" --protocol "$p" D D > /dev/null 2>> "$out/repeat.err"
  done
done
$bin/bench-report "$out" > "$out/report.md" 2>> "$out/repeat.err"
echo "== osu_bw D D GB/s, medians of $reps runs"; cat "$out/protocols.csv"
echo "== osu_latency D D 8 B, us, sorted"
for p in auto get put coop; do echo "$p: $(grep "^osu_latency,D D,$p,8," "$out/gpulmt.csv" | cut -d, -f6 | sort -n | tr '\n' ' ')"; done
