#!/usr/bin/env bash
# Session-2 exploration on the 2-GPU host: what the changes of this session buy, each
# beside the anchors of the same call.
#  - small device copies as a kernel (GPULMT_SM_COPY_MAX) vs the copy engine: D D latency
#  - osu_bibw 1-64 MiB per protocol and with two lanes (the 4-16 MiB gap)
#  - SHM streaming ring: osu_bw --protocol shm per chunk size
#  - the PMPI shim with cudaMalloc buffers (tests/c/p2p.c and examples/cuda_osu.c built
#    here with mpicc + CUDA), beside gpulmt's own osu_bw and plain Open MPI for H H
#  - Stencil2D overlap at 4096^2 (boundary on the comm stream)
# Usage: bash bench/gpu/explore_h200x2.sh OUTDIR   (binaries in .gpu/bin, anchors in .gpu/tools)
# Ran once, at 05:47 UTC on 2026-11-22 (bench/results/h200x2/explore1). The build it ran
# had a GPULMT_SM_COPY_MAX option (tiny device copies as a kernel, unit test
# gpu_sm_copies, carried as .gpu/bin/gpulmt-unit); it was slower than the copy engine
# everywhere and was removed before commit, so those two steps no longer apply.
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
run="$bin/gpulmt-run -n 2 --timeout 120 --"
export GPULMT_DEVICE=cuda NCCL_NVLS_ENABLE=0
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
CUDA=${CUDA_HOME:-/usr/local/cuda}

log anchors
bash .gpu/tools/anchors.sh 268435456 > "$out/anchors.csv" 2> "$out/anchors.err"

log gpu unit tests: small-copy kernel vs copy engine
$bin/gpulmt-unit --ignored --test-threads=1 --nocapture device::cuda::tests::gpu_sm_copies device::cuda::tests::gpu_copy_overhead > "$out/unit.txt" 2>&1
tail -20 "$out/unit.txt" >&2

csv="$out/gpulmt.csv"
log latency: SM copy thresholds
for sm in 0 8K 64K; do
  GPULMT_SM_COPY_MAX=$sm GPULMT_LOG=gpulmt=info $run $bin/osu_latency -m 1:1M --csv "$out/lat_sm_$sm.csv" D D 2> "$out/lat_sm_$sm.err"
done
$run $bin/osu_latency -m 0:8K -i 100000 --csv "$csv" H H

log bibw variants
for p in auto get put; do $run $bin/osu_bibw -m 1M:64M --csv "$out/bibw_$p.csv" --protocol $p D D; done
for p in get put; do GPULMT_LANES=2 GPULMT_COPY_SPLIT=2M $run $bin/osu_bibw -m 1M:64M --csv "$out/bibw_${p}_lanes2.csv" --protocol $p D D; done
$run $bin/osu_bw -m 64K:256M --csv "$csv" D D

log shm streaming ring per chunk size
for c in 1M 2M 512K; do
  GPULMT_CHUNK_SIZE=$c $run $bin/osu_bw -m 1M:256M --large-budget 2G --csv "$out/shm_chunk_$c.csv" --protocol shm D D
done
GPULMT_PIPELINE_DEPTH=16 $run $bin/osu_bw -m 1M:256M --large-budget 2G --csv "$out/shm_depth16.csv" --protocol shm D D

log shim with cudaMalloc
mpicc -O2 -DP2P_CUDA_MALLOC -I$CUDA/include -Iffi/shim/include ffi/shim/tests/c/p2p.c -L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64 -o /tmp/p2p_cuda 2> "$out/shim_build.txt"
mpicc -O2 -I$CUDA/include ffi/shim/examples/cuda_osu.c -L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64 -o /tmp/cuda_osu 2>> "$out/shim_build.txt"
shim="-x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda"
for np in 2 4; do
  timeout 180 $mpirun -np $np $shim /tmp/p2p_cuda > "$out/shim_p2p_np$np.txt" 2>&1; echo "p2p np=$np rc=$?" | tee -a "$out/log.txt"
  grep -E "ok checks|FAIL|counters" "$out/shim_p2p_np$np.txt" | head -8
done
timeout 240 $mpirun -np 2 $shim /tmp/cuda_osu > "$out/shim_cuda_osu.csv" 2> "$out/shim_cuda_osu.err"; echo "cuda_osu shim rc=$?" | tee -a "$out/log.txt"
timeout 120 $mpirun -np 2 /tmp/cuda_osu host > "$out/plain_cuda_osu_host.csv" 2>&1; echo "cuda_osu plain host rc=$?" | tee -a "$out/log.txt"
timeout 120 $mpirun -np 2 $shim /tmp/cuda_osu host > "$out/shim_cuda_osu_host.csv" 2>&1
cat "$out/shim_cuda_osu.csv" "$out/plain_cuda_osu_host.csv" "$out/shim_cuda_osu_host.csv" >&2

log stencil overlap
export CUDA_MPS_PIPE_DIRECTORY=/tmp/gpulmt-mps CUDA_MPS_LOG_DIRECTORY=/tmp/gpulmt-mpslog
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d 2>/dev/null && echo "mps=1" > "$out/stencil_env.txt" || echo "mps=0" > "$out/stencil_env.txt"
st() { n=$1; shift; $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" > /tmp/stencil.txt 2>&1 || { echo "FAILED: -n $n $*" >&2; tail -3 /tmp/stencil.txt >&2; }; }
for n in 2 4; do for p in single double; do
  st "$n" --size 512 --iters 20 --halo 4 --mode inter-k-overlap --precision "$p" --check --csv "$out/stencil_check.csv"
done; done
for p in single double; do for h in 1 4; do
  for m in inter-k inter-k-overlap; do st 2 --size 4096 --halo "$h" --precision "$p" --mode "$m" --iters 200 --csv "$out/stencil.csv"; done
  st 1 --size 4096 --halo "$h" --precision "$p" --mode inter-k --iters 200 --csv "$out/stencil.csv"
done; done
echo quit | nvidia-cuda-mps-control 2>/dev/null
log done
