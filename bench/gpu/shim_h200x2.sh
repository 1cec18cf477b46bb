#!/usr/bin/env bash
# The PMPI shim on the 2-GPU host with an application's own cudaMalloc buffers:
# ffi/shim/tests/c/p2p.c (every semantic check, -DP2P_CUDA_MALLOC) under mpirun -np 2
# and -np 4 (two ranks per GPU), and ffi/shim/examples/cuda_osu.c (bandwidth, latency,
# byte checks), both built here with the host's mpicc and CUDA; beside them, in the same
# call, gpulmt's own osu_bw D D and the host-buffer latency of plain Open MPI, with
# and without the shim preloaded.
# Usage: bash bench/gpu/shim_h200x2.sh OUTDIR   (binaries in .gpu/bin)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
export GPULMT_DEVICE=cuda
CUDA=${CUDA_HOME:-/usr/local/cuda}
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
shim="-x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda"
log() { echo "== $(date +%T) $*" | tee -a "$out/shim_log.txt" >&2; }

mpicc -O2 -DP2P_CUDA_MALLOC -I$CUDA/include -Iffi/shim/include ffi/shim/tests/c/p2p.c -L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64 -o /tmp/p2p_cuda
mpicc -O2 -I$CUDA/include ffi/shim/examples/cuda_osu.c -L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64 -o /tmp/cuda_osu
mpicc -O2 bench/anchors/mpi_pingpong.c -o /tmp/mpi_pingpong

log p2p semantics on cudaMalloc buffers
for np in 2 4; do
  timeout 180 $mpirun -np $np $shim /tmp/p2p_cuda > "$out/shim_p2p_np$np.txt" 2>&1
  echo "p2p_cuda_malloc,np=$np,rc=$?,$(grep -c ' ok checks' "$out/shim_p2p_np$np.txt") ranks ok" | tee -a "$out/shim_log.txt"
done
for i in 1 2 3; do
  timeout 120 $mpirun -np 4 $shim -x P2P_PARTS=sendrecv_ring /tmp/p2p_cuda > /tmp/p2p_part.txt 2>&1
  echo "p2p_cuda_malloc,np=4 sendrecv_ring only,rc=$?" | tee -a "$out/shim_log.txt"; grep FAIL /tmp/p2p_part.txt | tee -a "$out/shim_log.txt"
done
timeout 180 $mpirun -np 4 $shim -x GPULMT_HANDLE_CACHE=0 /tmp/p2p_cuda > "$out/shim_p2p_np4_nocache.txt" 2>&1
echo "p2p_cuda_malloc,np=4 handle cache off,rc=$?" | tee -a "$out/shim_log.txt"; grep FAIL "$out/shim_p2p_np4_nocache.txt" | tee -a "$out/shim_log.txt"

log cuda_osu under the shim, and host latency with and without it
timeout 240 $mpirun -np 2 $shim /tmp/cuda_osu > "$out/shim_cuda_osu.csv" 2> "$out/shim_cuda_osu.err"
echo "cuda_osu,rc=$?" | tee -a "$out/shim_log.txt"
for i in 1 2 3; do
  timeout 60 $mpirun -np 2 /tmp/cuda_osu host >> "$out/host_latency.csv" 2>&1
  timeout 60 $mpirun -np 2 $shim /tmp/cuda_osu host | sed 's/^cuda_osu/cuda_osu_shim/' >> "$out/host_latency.csv" 2>&1
done
log gpulmt osu_bw and H H latency in the same call
$bin/gpulmt-run -n 2 --timeout 120 -- $bin/osu_bw -m 1M:256M --csv "$out/gpulmt_bw.csv" D D > /dev/null 2>&1
cat "$out/host_latency.csv" >&2
