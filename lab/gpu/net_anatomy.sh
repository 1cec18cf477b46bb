#!/usr/bin/env bash
# Where an 8 B and a 4 KiB D D leg across 2 pseudo-nodes go, step by step, with the copy engine
# (GPULMT_COPY_SERVER_MAX=0) and with the copy server (64K): anatomy_<bytes>_server<max>.csv
# (bench/gpu/anatomy_net.py; the copy steps split into issue and seen-finished). Under a minute.
# Usage: bash lab/gpu/net_anatomy.sh OUTDIR   (.gpu/bin/osu_latency_anatomy_mpi: bench/gpu/prepare.sh)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_anatomy.sh OUTDIR}"
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_COPY_SERVER_MAX"
MPS=1 start_mps
for s in 0 64K; do
 for b in 8 4096; do
  GPULMT_COPY_SERVER_MAX=$s net_anatomy "$bin/osu_latency_anatomy_mpi" $b 5000 "$pn" "$out/anatomy_${b}_server$s.csv"
 done
done
stop_mps
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
