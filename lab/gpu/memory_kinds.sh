#!/usr/bin/env bash
# Runs lab/gpu/memory_kinds.cu on the GPU host, without MPS and under MPS (issue 45: what each
# memory kind reports, exports and imports). Usage: bash lab/gpu/memory_kinds.sh OUTDIR
set -uo pipefail
out=${1:?outdir}; mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}; PATH=$PATH:$cuda/bin
nvcc -O2 lab/gpu/memory_kinds.cu -lcuda -o /tmp/memory_kinds 2>&1 | tee "$out/build.txt" || exit 1
echo "== no MPS"; timeout 120 /tmp/memory_kinds 2>&1 | tee "$out/nomps.csv"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mk-mps CUDA_MPS_LOG_DIRECTORY=/tmp/mk-mpslog
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "== MPS"
timeout 120 /tmp/memory_kinds 2>&1 | tee "$out/mps.csv"
echo quit | nvidia-cuda-mps-control
