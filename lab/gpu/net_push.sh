#!/usr/bin/env bash
# The pushed rendezvous (GPULMT_NET_PUSH_MAX) and the proxy's tight timer slack, across 2
# pseudo-nodes on one GPU over Open MPI's shared memory (vader), under MPS:
# - osu_latency D D and H H, 8 B to 64 MiB, ROUNDS rounds (default 2) of three variants in
#   alternation: `old` (osu_latency_mpi_old: the build before both changes, CTS always,
#   default timer slack), `cts` (this build with GPULMT_NET_PUSH_MAX=0: CTS always, tight
#   slack) and `push` (this build's defaults); lat_<variant>_<round>_<placement>.csv;
# - the host-staged anchor and Open MPI's own H H (../shared/device/staged_mpi.sh) beside
#   them (staged_mpi.csv, host_mpi.csv);
# - osu_latency D D 8 B-64 KiB with the copy server (GPULMT_COPY_SERVER_MAX=64K), push
#   and cts (lat_server_<variant>.csv);
# - osu_bw D D and H H at 4-64 MiB, push and cts (bw_<variant>_<placement>.csv);
# - what a 1 us sleep costs with the default timer slack and with 1 us (sleep_cost.txt);
# the table in summary.txt. After each step everything so far is packed into OUTDIR.tgz,
# one file: a call that runs out of time still brings back what was measured (a call
# returns at most 8 files, and the first run of this script lost all of its own so).
# About 2.5 minutes on one H200 (the steps' times are in log.txt).
# Usage: bash lab/gpu/net_push.sh OUTDIR    (binaries in .gpu/bin, anchors in .gpu/tools)
# The binaries: gpulmt-mpi-nodes, osu_latency_mpi, osu_bw_mpi (bench/gpu/prepare.sh), and
# osu_latency_mpi_old, the same osu_latency built at 4993c1c (the commit before the pushed
# rendezvous): git worktree add /tmp/old 4993c1c && (cd /tmp/old && cargo build --release
# -p gpulmt-bench --features mpi --bin osu_latency) && cp /tmp/old/target/release/osu_latency
# .gpu/bin/osu_latency_mpi_old && strip .gpu/bin/osu_latency_mpi_old.
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_push.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2"
cc -O2 lab/gpu/sleep_cost.c -o /tmp/sleep_cost && /tmp/sleep_cost > "$out/sleep_cost.txt" 2>&1
MPS=1 start_mps
if have_nvcc; then
  timeout 90 bash .gpu/tools/staged_mpi.sh 67108864 host > "$out/host_mpi.csv" 2>> "$out/log.txt"
  timeout 90 bash .gpu/tools/staged_mpi.sh 67108864 > "$out/staged_mpi.csv" 2>> "$out/log.txt"
fi
pack
# osu_latency as variant $1 (old, cts, push) with the arguments that follow, and the
# mpirun options in the array `extra`.
extra=()
run_variant() {
  local v=$1 b=osu_latency_mpi
  shift
  local env=("${extra[@]}")
  case $v in
    old) b=osu_latency_mpi_old ;;
    cts) env+=(-x GPULMT_NET_PUSH_MAX=0) ;;
    push) ;;
  esac
  timeout 60 $pn "${env[@]}" -np 2 "$bin/$b" --large-budget 1G "$@" > /dev/null 2>> "$out/log.txt" \
    || log "FAILED: $v $*"
}
for r in $(seq "${ROUNDS:-2}"); do
  for v in old cts push; do
    for pl in "D D" "H H"; do
      log "latency round $r, $v, $pl"
      # shellcheck disable=SC2086 # the placement is two words
      run_variant $v -i 2000 -m 8:64M --csv "$out/lat_${v}_${r}_${pl// /}.csv" $pl
    done
  done
  pack
done
extra=(-x GPULMT_COPY_SERVER_MAX=64K)
for v in cts push; do
  log "latency with the copy server, $v"
  run_variant $v -i 2000 -m 8:64K --csv "$out/lat_server_$v.csv" D D
done
extra=()
pack
for v in cts push; do
  for pl in "D D" "H H"; do
    log "bandwidth, $v, $pl"
    # shellcheck disable=SC2086
    timeout 90 $pn $([ $v = cts ] && echo -x GPULMT_NET_PUSH_MAX=0) -np 2 "$bin/osu_bw_mpi" --large-budget 1G \
      -m 4M:64M --csv "$out/bw_${v}_${pl// /}.csv" $pl > /dev/null 2>> "$out/log.txt" || log "FAILED: bw $v $pl"
  done
done
stop_mps
python3 lab/gpu/net_push_summary.py "$out" > "$out/summary.txt" 2>&1
log done
pack
