#!/usr/bin/env bash
# Where PUT starts to beat GET one way (GPULMT_PUT_MIN), with ranks bound to cores: ROUNDS
# rounds of osu_bw D D 64 KiB - 1 MiB, forced GET, forced PUT and auto in rotated order,
# every run's rows appended to OUTDIR/gpulmt.csv; bench-report's protocols.csv holds the
# medians. Prints them and each cell's range.
# Usage: bash bench/gpu/put_vs_get_h200x2.sh OUTDIR [ROUNDS=10]   (after prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
rounds=${2:-10}
order=(get put auto)
for r in $(seq "$rounds"); do
  for k in 0 1 2; do
    p=${order[$(( (k + r) % 3 ))]}
    $bin/gpulmt-run -n 2 --timeout 120 -- $bin/osu_bw -m 64K:1M --csv "$out/gpulmt.csv" --protocol "$p" D D > /dev/null 2>> "$out/err.txt"
  done
done
$bin/bench-report "$out" > "$out/report.md" 2>> "$out/err.txt"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== medians of $rounds (GB/s)"; cat "$out/protocols.csv"
echo "== ranges"
for b in 65536 131072 262144 524288 1048576; do
  printf "%s:" "$b"
  for p in get put auto; do
    printf " %s %s" "$p" "$(grep "^osu_bw,D D,$p,$b," "$out/gpulmt.csv" | cut -d, -f6 | sort -n | awk '{a[NR]=$1/1000} END{printf "%.1f-%.1f", a[1], a[NR]}')"
  done
  echo
done
