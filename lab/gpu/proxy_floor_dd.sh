#!/usr/bin/env bash
# The floor of the internode path's design for an 8 B D D message (lab/gpu/proxy_floor_dd.cu:
# the copies and a proxy thread's hand-offs, nothing else) against the host-staged anchor's
# way in the same program and gpulmt's osu_latency D D across 2 pseudo-nodes, ROUNDS rounds
# in alternation, both ranks on GPU 0 (under MPS where the host has one GPU).
# Usage: bash lab/gpu/proxy_floor_dd.sh OUTDIR   (ROUNDS, default 3) -> floor.csv, gpulmt_*.csv
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: proxy_floor_dd.sh OUTDIR}"
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
[ "$(gpu_count)" -lt 2 ] && MPS=1 start_mps
build_cuda_mpi lab/gpu/proxy_floor_dd.cu /tmp/proxy_floor_dd || { log "no nvcc, or the build failed (log.txt)"; exit 1; }
echo "round,mode,pool,iters,half_round_trip_us" > "$out/floor.csv"
for r in $(seq "${ROUNDS:-3}"); do
  for mode in staged proxy; do
    log "round $r: $mode"
    timeout 60 $mpirun -np 2 /tmp/proxy_floor_dd $mode 20000 34 < /dev/null 2>> "$out/log.txt" | sed "s/^/$r,/" >> "$out/floor.csv"
  done
  log "round $r: gpulmt osu_latency D D"
  timeout 60 $mpirun -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -np 2 "$bin/osu_latency_mpi" -m 8:8 \
    --csv "$out/gpulmt_$r.csv" D D < /dev/null > /dev/null 2>> "$out/log.txt"
done
stop_mps
