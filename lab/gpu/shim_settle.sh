#!/usr/bin/env bash
# Where the PMPI shim's 8 B D D latency goes beyond gpulmt's own: in one call,
# copy_probe's settle rows (what asking about the application's legacy default stream
# and classifying a pointer cost on this driver), then ROUNDS rotated rounds of
# ffi/shim/examples/cuda_osu.c's 8 B D D ping-pong under the shim with the default-stream
# wait (GPULMT_MPI_SETTLE=default-stream, the default) and without it (none), and
# gpulmt's own osu_latency D D 8 B beside them, with RTR offers (native) and without
# (native_nortr: GET, as under the shim, whose own matching never offers).
# On one GPU (nvidia-h200) both ranks share it; MPS=1 starts the MPS daemon first.
# Usage: [ROUNDS=5] [MPS=1] bash lab/gpu/shim_settle.sh OUTDIR   (after prepare.sh; carry .gpu)
source "$(dirname "$0")/lab.sh"
nvidia-smi > "$out/host.txt" 2>&1
start_mps
log copy_probe
$bin/copy_probe 8 > "$out/copy_probe_8.csv" 2>> "$out/log.txt"
build_cuda_osu
echo "variant,round,us" > "$out/shim_settle.csv"
shim_lat() { # variant round assignments...
  echo "$1,$2,$(shim_latency "$1 round $2" "${@:3}")" >> "$out/shim_settle.csv"
}
native_lat() { # round; then with RTR offers off (GET, as the shim's own matching has it)
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv /tmp/native.csv D D > /dev/null 2>> "$out/log.txt"
  echo "native,$1,$(tail -n 1 /tmp/native.csv | cut -d, -f6)" >> "$out/shim_settle.csv"
  GPULMT_RTR_PUT_MAX=0 $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv /tmp/native.csv D D > /dev/null 2>> "$out/log.txt"
  echo "native_nortr,$1,$(tail -n 1 /tmp/native.csv | cut -d, -f6)" >> "$out/shim_settle.csv"
}
for i in $(seq "${ROUNDS:-5}"); do
  log round $i
  case $((i % 3)) in
    0) shim_lat settle $i X=1; shim_lat none $i GPULMT_MPI_SETTLE=none; native_lat $i ;;
    1) shim_lat none $i GPULMT_MPI_SETTLE=none; native_lat $i; shim_lat settle $i X=1 ;;
    2) native_lat $i; shim_lat settle $i X=1; shim_lat none $i GPULMT_MPI_SETTLE=none ;;
  esac
done
stop_mps
log done
grep settle_ "$out/copy_probe_8.csv"
variant_medians "$out/shim_settle.csv"
