#!/usr/bin/env bash
# The PMPI shim across 2 pseudo-nodes on one GPU under MPS, against gpulmt's own internode
# path (GIO queues and proxies) and the host-staged anchor, in one call: does the shim's
# staging of off-node device messages (a whole copy each side around the PMPI call) cost
# what the proxy's pipelined staging would save? Rounds in alternation:
#   shim_<r>.csv        cuda_osu under the shim, 2 pseudo-nodes: 8 B lat D D / H H, bw D D 1-64 MiB
#   gpulmt_lat_<r>.csv  osu_latency_mpi D D 8 B across 2 pseudo-nodes
#   gpulmt_bw_<r>.csv   osu_bw_mpi D D 1-64 MiB across 2 pseudo-nodes
# then shim_node.csv (the shim on one node, LMT), staged_mpi.csv and host_mpi.csv (anchors).
# Usage: ROUNDS=2 [MPI_X="-x VAR=value ..."] bash lab/gpu/shim_offnode.sh OUTDIR   (OUTDIR.tgz)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: shim_offnode.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none ${MPI_X:-}"
pn="$mpirun -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2"
shim="-x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so"
MPS=1 start_mps
build_cuda_osu || log "cuda_osu did not build"
for r in $(seq "${ROUNDS:-2}"); do
  log "round $r: shim across pseudo-nodes"
  # shellcheck disable=SC2086
  timeout 200 $pn -np 2 $shim /tmp/cuda_osu 67108864 > "$out/shim_$r.csv" 2>> "$out/log.txt" || log "shim FAILED"
  log "round $r: gpulmt across pseudo-nodes"
  timeout 120 $pn -np 2 "$bin/osu_latency_mpi" -m 8:8 --csv "$out/gpulmt_lat_$r.csv" D D > /dev/null 2>> "$out/log.txt" \
    || log "osu_latency_mpi FAILED"
  timeout 200 $pn -np 2 "$bin/osu_bw_mpi" --large-budget 2G -m 1M:64M --csv "$out/gpulmt_bw_$r.csv" D D > /dev/null 2>> "$out/log.txt" \
    || log "osu_bw_mpi FAILED"
  pack
done
log "shim on one node (LMT)"
# shellcheck disable=SC2086
timeout 200 $mpirun -x GPULMT_DEVICE -np 2 $shim /tmp/cuda_osu 67108864 > "$out/shim_node.csv" 2>> "$out/log.txt" || log "FAILED"
log anchors
bash .gpu/tools/staged_mpi.sh 67108864 > "$out/staged_mpi.csv" 2>> "$out/log.txt" || log "staged FAILED"
bash .gpu/tools/staged_mpi.sh 67108864 host > "$out/host_mpi.csv" 2>> "$out/log.txt" || log "host FAILED"
stop_mps
log done
pack
