#!/usr/bin/env bash
# A/B of binary sets and settings on the small-message path, in one call.
# Runs: the anchors' small-copy latency, copy_probe 8, the CUDA backend's GPU unit tests,
# ROUNDS rotated rounds of osu_latency 8 B D D for each of LAT (space-separated
# `name:set:ENV=VALUE[,ENV=VALUE]`; set = a folder under .gpu), then, 3 alternating rounds
# for each of SWEEP (`name:ENV=VALUE`, this commit's binaries), osu_latency 8 B - 1 MiB and
# osu_bw 8 KiB - 2 MiB D D. Rows go to OUTDIR/ab.csv as `variant,round,bench,bytes,metric,value`.
# Usage: [LAT=...] [SWEEP=...] ROUNDS=5 bash lab/gpu/ab.sh OUTDIR   (after prepare.sh; carry .gpu)
# engab1 ran its first version (7701a97) as engine_ab_h200x2.sh, i.e. LAT="base:base:X=1
# noeng:bin:GPULMT_GET_SENDER_ENGINE_MAX=0 new:bin:X=1" SWEEP="eng0:GPULMT_GET_SENDER_ENGINE_MAX=0
# eng2m:GPULMT_GET_SENDER_ENGINE_MAX=2M" (that option has since been removed).
source "$(dirname "$0")/lab.sh"
lat_variants=${LAT:-base:base:X=1 nortr:bin:GPULMT_RTR_PUT_MAX=0 rtr:bin:X=1}
sweep_variants=${SWEEP:-nortr:GPULMT_RTR_PUT_MAX=0 rtr:GPULMT_RTR_PUT_MAX=64K rtr2m:GPULMT_RTR_PUT_MAX=2M}
small_copy_baselines
log unit
$bin/gpulmt-unit --ignored --test-threads=1 device::cuda > "$out/unit.txt" 2>&1
log checks
$bin/gpulmt-run -n 2 --timeout 120 -- $bin/gpulmt-check pingpong --placement "D D" --sizes 1,7,4095,4096,65536,65537,1048576 --offset 4096 \
  > "$out/check_pingpong_dd.txt" 2>&1 && echo "check pingpong D D: ok" >> "$out/checks.txt" || echo "check pingpong D D: FAILED" >> "$out/checks.txt"
$bin/gpulmt-run -n 2 --timeout 120 -- $bin/osu_latency -m 1:64K -i 200 -c --stats D D \
  > "$out/osu_latency_validated.txt" 2>&1 && echo "osu_latency -c D D: ok" >> "$out/checks.txt" || echo "osu_latency -c D D: FAILED" >> "$out/checks.txt"
echo "variant,round,bench,bytes,metric,value" > "$out/ab.csv"
one() { # variant round set env-assignments(comma-separated) bench args...
  local v=$1 r=$2 set=$3 envs=${4//,/ }; shift 4
  rm -f /tmp/ab.csv
  env $envs ".gpu/$set/gpulmt-run" -n 2 --timeout 120 -- ".gpu/$set/$@" --csv /tmp/ab.csv --stats D D >> "$out/stats_$v.txt" 2>> "$out/log.txt" \
    || echo "$v round $r failed" >> "$out/log.txt"
  append_rows "$v" "$r" /tmp/ab.csv "$out/ab.csv"
}
read -r -a lat <<< "$lat_variants"
for r in $(seq "${ROUNDS:-5}"); do
  log "latency round $r"
  for k in $(seq 0 $(( ${#lat[@]} - 1 ))); do
    IFS=: read -r name set envs <<< "${lat[$(( (k + r) % ${#lat[@]} ))]}"
    one "$name" "$r" "$set" "$envs" osu_latency -m 8:8 -i 20000
  done
done
for r in 1 2 3; do
  log "sizes round $r"
  for spec in $sweep_variants; do
    IFS=: read -r name envs <<< "$spec"
    one "$name" "$r" bin "$envs" osu_latency -m 8:1M -i 2000
    one "$name" "$r" bin "$envs" osu_bw -m 8K:2M -i 200
  done
done
log done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
grep ce_latency "$out/anchors.csv"
grep -E "ipc_(pull|push)_(memcpy_eventquery|call_memcpyasync|gpulmt_copy_async_poll)" "$out/copy_probe_8.csv"
grep -E "test result" "$out/unit.txt" | tail -3
cat "$out/checks.txt"
for f in "$out"/stats_*.txt; do echo "$(basename "$f"): $(grep -h "rank 1 protocols" "$f" | head -3 | cut -c1-60 | tr '\n' ';')"; done
python3 - "$out/ab.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
cell = collections.defaultdict(list)
for r in rows:
    cell[(r["variant"], r["bench"], int(r["bytes"]))].append(float(r["value"]))
def med(v): v = sorted(v); return v[len(v) // 2]
print("variant,bench,bytes,median,values")
for k in sorted(cell, key=lambda k: (k[1], k[2], k[0])):
    print(f"{k[0]},{k[1]},{k[2]},{med(cell[k]):.3f}," + " ".join(f"{x:.2f}" for x in cell[k]))
PY
