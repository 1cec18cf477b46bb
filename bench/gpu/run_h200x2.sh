#!/usr/bin/env bash
# The GPU experiment of gpulmt on a 2-GPU host (the device tool's nvidia-h200-x2):
# the host's ceilings (anchors) and gpulmt's OSU-style benchmarks in one run, so every
# number can be reported as a ratio to a ceiling measured beside it.
#
# Usage (repo root on the GPU host, binaries built elsewhere and carried in .gpu/):
#   bash bench/gpu/run_h200x2.sh [quick|full] [outdir]
# Expects .gpu/bin/{gpulmt-run,osu_latency,osu_bw,osu_bibw,gpulmt-check} and
# .gpu/tools/ (a copy of ../shared/device). Writes CSVs into outdir ($OUT by default).
set -uo pipefail
mode=${1:-full}
out=${2:-${OUT:-/tmp/gpulmt-out}}
mkdir -p "$out"
bin=.gpu/bin
run="$bin/gpulmt-run -n 2 --timeout 240 --"
export GPULMT_DEVICE=cuda NCCL_NVLS_ENABLE=0
log() { echo "== $(date +%T) $*" >&2; }

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$out/host.txt" 2>&1
nvidia-smi topo -m >> "$out/host.txt" 2>&1

if [ "$mode" = quick ]; then
  log correctness
  for p in auto get put coop shm; do
    for pl in "D D" "D H" "H D" "H H"; do
      GPULMT_PROTOCOL=$p $run $bin/gpulmt-check pingpong --placement "$pl" --sizes 0,1,7,4095,4096,65537,4194304,67108864 --offset 4096 \
        > /tmp/chk.txt 2>&1 && echo "check,$p,$pl,ok,$(grep -o 'protocols.*' /tmp/chk.txt | head -1)" || { echo "check,$p,$pl,FAIL"; tail -5 /tmp/chk.txt; }
    done
  done | tee "$out/check.csv"
  log smoke benchmarks
  $run $bin/osu_latency -m 0:1M -i 2000 -c D D | tee "$out/smoke_lat.txt"
  for p in get put coop shm; do $run $bin/osu_bw -m 64K:256M -i 100 -c --stats --protocol $p D D | tail -3; done | tee "$out/smoke_bw.txt"
  exit 0
fi

if [ "$mode" = tune ]; then
  csv="$out/tune.csv"; rm -f "$csv"
  mpicc -O2 bench/anchors/mpi_pingpong.c -o /tmp/mpi_pingpong && \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 /tmp/mpi_pingpong 8 200000 > "$out/mpi_sm.csv" 2>&1
  $run $bin/osu_latency -m 8:8 -i 200000 --csv "$csv" H H
  GPULMT_DEVICE=sim $run $bin/osu_latency -m 8:8 -i 200000 --csv "$out/tune_sim.csv" H H
  GPULMT_MEMTYPE_CACHE=0 $run $bin/osu_latency -m 8:8 -i 200000 --csv "$out/tune_nocache.csv" H H
  for p in put get coop; do
    $run $bin/osu_bw -m 256K:64M --csv "$csv" --protocol $p D D
    $run $bin/osu_bibw -m 256K:64M --csv "$csv" --protocol $p D D
  done
  exit 0
fi

log anchors
bash .gpu/tools/anchors.sh 1073741824 > "$out/anchors.csv" 2> "$out/anchors.err"
log staged_mpi
bash .gpu/tools/staged_mpi.sh 67108864 > "$out/staged_mpi.csv" 2> "$out/staged_mpi.err"
log mpi_sm
mpicc -O2 bench/anchors/mpi_pingpong.c -o /tmp/mpi_pingpong && \
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 /tmp/mpi_pingpong 8192 100000 > "$out/mpi_sm.csv" 2>&1

csv="$out/gpulmt.csv"
rm -f "$csv"
log latency
$run $bin/osu_latency -m 0:1G --csv "$csv" D D
for p in get put coop; do $run $bin/osu_latency -m 1:64M --csv "$csv" --protocol $p D D; done
$run $bin/osu_latency -m 0:8K -i 100000 --csv "$csv" H H
log bandwidth per protocol
for p in auto get put coop; do
  $run $bin/osu_bw -m 64K:1G --csv "$csv" --stats --protocol $p D D
done
log bibw
for p in auto get coop; do
  $run $bin/osu_bibw -m 64K:1G --csv "$csv" --protocol $p D D
done
log split copies over lanes
GPULMT_COPY_SPLIT=16M GPULMT_LANES=4 $run $bin/osu_bw -m 1M:1G --csv "$out/split.csv" --protocol get D D
log shm fallback
$run $bin/osu_bw -m 64K:256M --large-budget 2G --csv "$csv" --protocol shm D D
log done
