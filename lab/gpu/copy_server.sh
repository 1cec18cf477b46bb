#!/usr/bin/env bash
# The copy server (GPULMT_COPY_SERVER_MAX) against the copy engine, in one call: the CUDA
# backend's GPU unit tests, server_probe (a resident kernel's copy beside the engine's),
# correctness checks with the server on (ping-pong 1 B - 64 KiB at odd sizes and offsets,
# a window of 64, all-to-all), then ROUNDS rotated rounds of osu_latency, osu_bw and
# osu_bibw D D from 1 B to 64 KiB per variant (`off` = engine, `on` = server up to 64 KiB),
# and with two GPUs the anchors up to 64 KiB. MPS=1 starts the MPS daemon (two ranks on
# one GPU: the server is refused without it, since time-slicing would stall it).
# Usage: [ROUNDS=3] [MPS=1] [VARIANTS="off:X=1 on:GPULMT_COPY_SERVER_MAX=64K"] bash lab/gpu/copy_server.sh OUTDIR
# (packs OUTDIR.tgz: copy that to $OUT, the device tool returns at most 8 files)
source "$(dirname "$0")/lab.sh"
variants=${VARIANTS:-off:X=1 on:GPULMT_COPY_SERVER_MAX=64K}
nvidia-smi > "$out/host.txt" 2>&1
ngpu=$(nvidia-smi -L | wc -l)
log unit
$bin/gpulmt-unit --ignored --test-threads=1 device::cuda > "$out/unit.txt" 2>&1
log server_probe
$bin/server_probe 8 4096 65536 > "$out/server_probe.csv" 2>> "$out/log.txt"
if [ "$ngpu" -ge 2 ]; then
  log anchors
  bash .gpu/tools/anchors.sh 65536 > "$out/anchors.csv" 2> "$out/anchors.err"
  $bin/copy_pingpong -m 1:64K -i 20000 > "$out/floor.csv" 2>> "$out/log.txt"
fi
start_mps
echo "mps=$mps gpus=$ngpu" > "$out/env.txt"
log checks
check() { # name gpulmt-check args...
  local name=$1; shift
  if GPULMT_COPY_SERVER_MAX=64K GPULMT_LOG=gpulmt=info $bin/gpulmt-run -n 2 --timeout 120 -- $bin/gpulmt-check "$@" > "$out/check_$name.txt" 2>&1; then
    echo "check $name: ok" >> "$out/checks.txt"
  else
    echo "check $name: FAILED" >> "$out/checks.txt"
  fi
}
check pingpong pingpong --placement "D D" --sizes 1,7,8,4096,4099,65536,65537,1048576 --offset 4096
check pingpong_offset pingpong --placement "D D" --sizes 1,13,4096,65535 --offset 3
check window window --placement "D D" --count 64 --sizes 8,4096,65536 --same-tag
check alltoall alltoall --iters 20
grep -h "copy server" "$out"/check_*.txt | sort | uniq -c | head -5 >> "$out/checks.txt"
echo "variant,round,bench,bytes,metric,value" > "$out/server.csv"
osu_variant() { # name round envs
  osu_rows "$1" "$2" "${3:-}" "$out/server.csv" osu_latency -m 1:64K -i 10000
  osu_rows "$1" "$2" "${3:-}" "$out/server.csv" osu_bw -m 1:64K
  osu_rows "$1" "$2" "${3:-}" "$out/server.csv" osu_bibw -m 1:64K
}
rotated_rounds "$variants" osu_variant 3
# The PMPI shim's 8 B D D (ffi/shim/examples/cuda_osu.c) with and without the server.
if command -v mpicc > /dev/null; then
  log shim
  build_cuda_osu
  for r in $(seq "${ROUNDS:-3}"); do
    for v in off on; do
      x=X=1; [ $v = on ] && x=GPULMT_COPY_SERVER_MAX=64K
      echo "shim_$v,$r,cuda_osu_lat,8,us,$(shim_latency "shim $v round $r" $x)" >> "$out/server.csv"
    done
  done
fi
log done
stop_mps
cat "$out/env.txt" "$out/checks.txt"
grep -E "test result|FAILED|panicked" "$out/unit.txt" | tail -4
grep -E "(server|gpulmt)_(local|push|pull)_[0-9]+,|engine_" "$out/server_probe.csv" | cut -d, -f2,3 | tr '\n' ' '; echo
python3 - "$out/server.csv" > "$out/server_table.csv" <<'PY'
import csv, statistics, sys
v = {}
for r in csv.DictReader(open(sys.argv[1])):
    v.setdefault((r["bench"], int(r["bytes"])), {}).setdefault(r["variant"], []).append(float(r["value"]))
names = sorted({n for d in v.values() for n in d})
print("bench,bytes," + ",".join(names))
for (b, n), d in sorted(v.items()):
    print(f"{b},{n}," + ",".join(f"{statistics.median(d[k]):.3f}" if k in d else "" for k in names))
PY
cat "$out/server_table.csv"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
