#!/usr/bin/env bash
# Issue 27's speed targets with one GPU per rank (a host of two or more GPUs, no MPS): 2
# pseudo-nodes over Open MPI's shared memory, rank r on GPU r. Is what misses them on one
# H200 (both ranks' copies on one GPU, under MPS) the one-GPU set-up? In one call:
#   lat.csv, bw.csv           gpulmt's osu_latency D D and H H (8 B - 4 MiB), osu_bw D D and H H (1-64 MiB)
#   staged_mpi.csv, host_mpi.csv   the host-staged anchor and Open MPI's own H H
#   staging_ceiling.csv       a hand-written staging pipeline's D D bandwidth at 4 and 16 MiB (no gpulmt)
# Usage: bash lab/gpu/x2_targets.sh OUTDIR   (binaries in .gpu/bin, anchors in .gpu/tools)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: x2_targets.sh OUTDIR}"
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2"
log "GPUs: $(gpu_count)"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
for pl in "D D" "H H"; do
  timeout 120 $pn -np 2 "$bin/osu_latency_mpi" -m 8:4M --csv "$out/lat.csv" $pl > /dev/null 2>> "$out/log.txt" || log "FAILED lat $pl"
  timeout 120 $pn -np 2 "$bin/osu_bw_mpi" --large-budget 2G -m 1M:64M --csv "$out/bw.csv" $pl > /dev/null 2>> "$out/log.txt" || log "FAILED bw $pl"
done
timeout 120 bash .gpu/tools/staged_mpi.sh 67108864 > "$out/staged_mpi.csv" 2>> "$out/log.txt" || log "FAILED staged"
timeout 120 bash .gpu/tools/staged_mpi.sh 67108864 host > "$out/host_mpi.csv" 2>> "$out/log.txt" || log "FAILED host"
echo "mode,size,window,chunk,nbuf,threads,GBps" > "$out/staging_ceiling.csv"
if build_staging_ceiling; then
  for s in 4194304 16777216; do
    timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 /tmp/staging_ceiling dd $s 64 524288 16 1 \
      < /dev/null >> "$out/staging_ceiling.csv" 2>> "$out/log.txt" || log "FAILED ceiling $s"
  done
fi
log done
