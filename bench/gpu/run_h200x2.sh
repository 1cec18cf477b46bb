#!/usr/bin/env bash
# The GPU experiment of gpulmt on a 2-GPU host (the device tool's nvidia-h200-x2):
# the host's ceilings (anchors) and gpulmt's OSU-style benchmarks in one run, so every
# number can be reported as a ratio to a ceiling measured beside it.
#
# Usage (repo root on the GPU host, binaries built elsewhere and carried in .gpu/):
#   bash bench/gpu/run_h200x2.sh [quick|full] [outdir]
# Expects .gpu/bin/{gpulmt-run,osu_latency,osu_bw,osu_bibw,gpulmt-check} and
# .gpu/tools/ (a copy of ../shared/device). Writes CSVs into outdir ($OUT by default).
# The device tool brings back only 8 files of $OUT: give a scratch outdir and pack it,
#   bash bench/gpu/run_h200x2.sh full /tmp/r; .gpu/bin/bench-report /tmp/r; tar czf $OUT/r.tgz -C /tmp/r .
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

checks() {
  # Correctness on real GPUs: every protocol x placement x sizes (random data,
  # non-zero offsets, checked byte for byte), two ranks on one GPU, 4 ranks on 2 GPUs,
  # the handle cache and two-phase free with real IPC, truncation, peer death.
  for p in auto get put coop shm; do
    for pl in "D D" "D H" "H D" "H H"; do
      GPULMT_PROTOCOL=$p $run $bin/gpulmt-check pingpong --placement "$pl" --sizes 0,1,7,4095,4096,65537,1048576,4194304,67108864,1073741824 --offset 4096 \
        > /tmp/chk.txt 2>&1 && echo "pingpong,$p,$pl,ok,$(grep -o 'protocols.*' /tmp/chk.txt | head -1 | tr ',' ' ')" || { echo "pingpong,$p,$pl,FAIL"; tail -5 /tmp/chk.txt; }
    done
  done
  for p in get put coop shm; do
    GPULMT_GPU=0 GPULMT_PROTOCOL=$p $run $bin/gpulmt-check pingpong --placement "D D" --sizes 1,65537,4194304,67108864 --offset 4096 > /tmp/chk.txt 2>&1 \
      && echo "same_gpu_pingpong,$p,D D,ok,$(grep -o 'protocols.*' /tmp/chk.txt | head -1 | tr ',' ' ')" || { echo "same_gpu_pingpong,$p,D D,FAIL"; tail -5 /tmp/chk.txt; }
  done
  one() { name=$1; shift; "$@" > /tmp/chk.txt 2>&1 && echo "$name,ok" || { echo "$name,FAIL"; tail -5 /tmp/chk.txt; }; }
  one same_device_3ranks env GPULMT_GPU=0 $bin/gpulmt-run -n 3 --timeout 120 -- $bin/gpulmt-check same-device
  one alltoall_4ranks_2gpus $bin/gpulmt-run -n 4 --timeout 120 -- $bin/gpulmt-check alltoall --iters 4
  one free_4ranks $bin/gpulmt-run -n 4 --timeout 120 -- $bin/gpulmt-check free --rounds 3 --fresh-open
  one cache_64_in_flight $run $bin/gpulmt-check cache
  for pl in "D D" "H D" "D H"; do one "truncate $pl" $run $bin/gpulmt-check truncate --placement "$pl"; done
  if [ -x "$bin/c_host" ]; then
    one c_abi_plugin_host_all_protocols $bin/c_host get put coop shm auto
    one c_abi_plugin_host_rings_all_protocols env GPULMT_HOST_RINGS=1 $bin/c_host get put coop shm auto
    one c_abi_endpoint_pingpong_device $run $bin/c_pingpong device 50 1 8 65536 4194304 67108864
  fi
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/gpulmt-check die --when mid --how kill --placement "D D" > /tmp/chk.txt 2>&1
  grep -q survivor-ok /tmp/chk.txt && echo "peer_death_mid_transfer,ok" || { echo "peer_death_mid_transfer,FAIL"; tail -5 /tmp/chk.txt; }
}

if [ "$mode" = quick ]; then
  checks | tee "$out/check.csv"
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
log copy_pingpong
$bin/copy_pingpong -m 1:64K -i 20000 > "$out/copy_pingpong.csv" 2>> "$out/log.txt"

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
for p in auto get put coop; do
  $run $bin/osu_bibw -m 64K:1G --csv "$csv" --protocol $p D D
done
log handle cache: osu_bw 1 MiB with and without the cache, windows 64 and 1
for w in 64 1; do
  for c in 1 0; do
    GPULMT_HANDLE_CACHE=$c $run $bin/osu_bw -m 1M:1M -W $w -i 200 --stats D D > /tmp/cache.txt 2>&1
    # Both ranks' counters: GET opens on the receiver, PUT and COOPERATE on the sender.
    echo "cache=$c window=$w $(grep -E '^1048576' /tmp/cache.txt | tr -s ' ') $(grep -E 'rank [01] ' /tmp/cache.txt | grep -o 'rank [01] .*cache hits.*open_ms=[0-9.]*' | tr '\n' ' ')"
  done
done | tee "$out/cache.txt"
log split copies over lanes
GPULMT_COPY_SPLIT=16M GPULMT_LANES=4 $run $bin/osu_bw -m 1M:1G --csv "$out/split.csv" --protocol get D D
log shm fallback
$run $bin/osu_bw -m 64K:256M --large-budget 2G --csv "$csv" --protocol shm D D
for c in 512K 2M 4M; do
  GPULMT_CHUNK_SIZE=$c $run $bin/osu_bw -m 4M:256M --large-budget 2G --csv "$out/shm_chunk_$c.csv" --protocol shm D D
done
if [ -x "$bin/stencil2d" ]; then
  log stencil2d
  bash bench/gpu/stencil_h200x2.sh "$out" || echo "stencil experiment failed" >&2
fi
log correctness
checks > "$out/check.csv"
grep -c ',ok' "$out/check.csv"; grep FAIL "$out/check.csv" || echo "all checks ok"
log done
