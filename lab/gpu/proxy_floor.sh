#!/usr/bin/env bash
# The floor of a proxy design against gpulmt's internode path at small sizes, in one call:
# lab/gpu/proxy_floor.c (8 B host ping-pong: blocking MPI; Isend + Testsome over a pool of
# ANY_SOURCE receives; the same made by a second thread with a hand-off each way), at
# MPI_THREAD_SINGLE and MULTIPLE and pools of 1 and 96 (gpulmt's 3 pools of 32), then
# gpulmt's osu_latency across 2 pseudo-nodes (H H, D D) and the host-staged anchor.
# Usage: bash lab/gpu/proxy_floor.sh OUTDIR   (after bench/gpu/prepare.sh; .gpu carried)
cd "$(dirname "$0")/../.."
source bench/gpu/preamble.sh "${1:?usage: proxy_floor.sh OUTDIR}"
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
mpicc -O2 -pthread lab/gpu/proxy_floor.c -o /tmp/proxy_floor || exit 1
csv=$out/proxy_floor.csv
echo "mode,level,pool,iters,half_round_trip_us,round" > "$csv"
for round in 1 2; do
  for lv in single multiple; do
    for pool in 1 96; do
      for mode in blocking pool; do
        [ $mode = blocking ] && [ $pool = 96 ] && continue
        MODE=$mode THREAD=$lv timeout 60 $mpirun -np 2 -x MODE -x THREAD /tmp/proxy_floor 100000 $pool \
          | sed "s/$/,$round/" >> "$csv"
      done
    done
  done
  for pool in 1 96; do
    MODE=proxy timeout 60 $mpirun -np 2 -x MODE /tmp/proxy_floor 100000 $pool | sed "s/$/,$round/" >> "$csv"
  done
  # gpulmt across 2 pseudo-nodes: the same 8 B host ping-pong through the GIO queues and
  # the proxies, then device buffers.
  for pl in "H H" "D D"; do
    timeout 120 $mpirun -np 2 -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 $bin/osu_latency_mpi -m 1:64K \
      --csv "$out/gpulmt_r$round.csv" $pl > /dev/null 2>> "$out/log.txt" || echo "osu_latency_mpi $pl failed" >> "$out/log.txt"
  done
done
if [ -f .gpu/tools/staged_mpi.sh ]; then
  bash .gpu/tools/staged_mpi.sh 65536 > "$out/staged_mpi.csv" 2>> "$out/log.txt"
  bash .gpu/tools/staged_mpi.sh 65536 host > "$out/host_mpi.csv" 2>> "$out/log.txt"
fi
nvidia-smi -L > "$out/host.txt" 2>&1
lscpu >> "$out/host.txt" 2>&1
cat "$csv"
