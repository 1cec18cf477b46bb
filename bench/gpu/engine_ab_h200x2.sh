#!/usr/bin/env bash
# Session 8 A/B: the CUDA backend's event-free lone copies and small GETs on the sender's
# engine (GPULMT_GET_SENDER_ENGINE_MAX), against the previous binaries (.gpu/base).
# Runs: the anchors' small-copy latency, copy_probe 8, the CUDA backend's GPU unit tests,
# ROUNDS rotated rounds of osu_latency 8 B D D (base; this build with the sender's engine
# off; this build as configured), then this build's osu_latency 8 B - 1 MiB and osu_bw
# 8 KiB - 2 MiB D D with the sender's engine off and up to 2 MiB (3 alternating rounds),
# and two anatomy runs. Rows go to OUTDIR/ab.csv as `variant,round,bench,bytes,metric,value`.
# Usage: ROUNDS=5 bash bench/gpu/engine_ab_h200x2.sh OUTDIR   (after prepare.sh; carry .gpu)
# It ran once, as engab1 (7701a97); GPULMT_GET_SENDER_ENGINE_MAX was removed after it (see
# bench/results/README.md, Session 8), so on later commits the "noeng" and "new" variants agree.
source "$(dirname "$0")/preamble.sh"
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
nvidia-smi > "$out/host.txt" 2>&1
log anchors
bash .gpu/tools/anchors.sh 8 > "$out/anchors.csv" 2> "$out/anchors.err"
log copy_probe
$bin/copy_probe 8 > "$out/copy_probe_8.csv" 2>> "$out/log.txt"
log unit
$bin/gpulmt-unit --ignored --test-threads=1 device::cuda > "$out/unit.txt" 2>&1
echo "variant,round,bench,bytes,metric,value" > "$out/ab.csv"
one() { # variant round set env-assignment bench args...
  local v=$1 r=$2 set=$3 envs=$4; shift 4
  rm -f /tmp/ab.csv
  env $envs ".gpu/$set/gpulmt-run" -n 2 --timeout 120 -- ".gpu/$set/$@" --csv /tmp/ab.csv D D > /dev/null 2>> "$out/log.txt" \
    || echo "$v round $r failed" >> "$out/log.txt"
  tail -n +2 /tmp/ab.csv 2>/dev/null | cut -d, -f1,4- | sed "s/^/$v,$r,/" >> "$out/ab.csv"
}
for r in $(seq "${ROUNDS:-5}"); do
  log "latency round $r"
  vs=(base noeng new)
  for k in 0 1 2; do
    case ${vs[$(( (k + r) % 3 ))]} in
      base) one base $r base "X=1" osu_latency -m 8:8 -i 20000 ;;
      noeng) one noeng $r bin "GPULMT_GET_SENDER_ENGINE_MAX=0" osu_latency -m 8:8 -i 20000 ;;
      new) one new $r bin "X=1" osu_latency -m 8:8 -i 20000 ;;
    esac
  done
done
for r in 1 2 3; do
  log "sizes round $r"
  for v in eng0 eng2m; do
    e=$([ $v = eng0 ] && echo 0 || echo 2M)
    one $v $r bin "GPULMT_GET_SENDER_ENGINE_MAX=$e" osu_latency -m 8:1M -i 2000
    one $v $r bin "GPULMT_GET_SENDER_ENGINE_MAX=$e" osu_bw -m 8K:2M -i 200
  done
done
for i in 1 2; do
  log anatomy $i
  OSU_ANATOMY=1 GPULMT_ANATOMY_OUT="$out/anat$i" .gpu/anatomy/gpulmt-run -n 2 --timeout 60 -- \
    .gpu/anatomy/osu_latency -m 8:8 -i 20000 D D > "$out/osu_anatomy$i.txt" 2>> "$out/log.txt"
  python3 bench/gpu/anatomy.py "$out/anat$i" > "$out/anatomy$i.csv" 2>> "$out/log.txt"
  gzip "$out/anat$i".*.csv
done
log done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
grep ce_latency "$out/anchors.csv"
grep -E "ipc_(pull|push)_(memcpy_eventquery|memcpy_streamquery|call_memcpyasync|gpulmt_copy_async_poll)" "$out/copy_probe_8.csv"
grep -E "^test |test result" "$out/unit.txt" | tail -15
python3 - "$out/ab.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
cell = collections.defaultdict(list)
for r in rows:
    cell[(r["variant"], r["bench"], int(r["bytes"]))].append(float(r["value"]))
def med(v): v = sorted(v); return v[len(v) // 2]
print("variant,bench,bytes,median,values")
for k in sorted(cell):
    print(f"{k[0]},{k[1]},{k[2]},{med(cell[k]):.3f}," + " ".join(f"{x:.2f}" for x in cell[k]))
PY
cat "$out/anatomy1.csv" "$out/anatomy2.csv"
