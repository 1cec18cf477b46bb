#!/usr/bin/env bash
# Stencil2D on the 2-GPU host: the seed's comparison of gpulmt's device-to-device
# halo exchange (inter-k, inter-k-overlap) against host staging, for 2 ranks (one
# per GPU) and 4 ranks (two per GPU, under MPS so the two processes of a GPU run
# concurrently), single and double precision, several sizes and halo widths; and the
# overlap check at 4096^2 beside compute alone (1 rank, no exchange).
# Usage: bash bench/gpu/stencil_h200x2.sh OUTDIR   (binaries in .gpu/bin)
set -uo pipefail
out=${1:?outdir}
bin=.gpu/bin
csv="$out/stencil.csv"
export GPULMT_DEVICE=cuda
iters=${STENCIL_ITERS:-200}
run() { n=$1; shift; $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" > /tmp/stencil.txt 2>&1 || { echo "FAILED: -n $n $*" >&2; tail -3 /tmp/stencil.txt >&2; }; }

# Correctness first: bit-identical to the single-rank CPU reference.
for n in 2 4; do for m in staged inter-k inter-k-overlap; do for p in single double; do
  run "$n" --size 512 --iters 20 --halo 4 --mode "$m" --precision "$p" --check --csv "$out/stencil_check.csv"
done; done; done

export CUDA_MPS_PIPE_DIRECTORY=/tmp/gpulmt-mps CUDA_MPS_LOG_DIRECTORY=/tmp/gpulmt-mpslog
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d 2>/dev/null && mps=1 || mps=0
echo "mps=$mps" > "$out/stencil_env.txt"

for n in 2 4; do for p in single double; do for s in 2048 4096 8192; do for h in 1 4; do for m in staged inter-k inter-k-overlap; do
  run "$n" --size "$s" --halo "$h" --precision "$p" --mode "$m" --iters "$iters" --csv "$csv"
done; done; done; done; done
# Compute alone: one rank, no neighbours.
for p in single double; do for h in 1 4; do
  run 1 --size 4096 --halo "$h" --precision "$p" --mode inter-k --iters "$iters" --csv "$csv"
done; done

[ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control
