#!/usr/bin/env bash
# Exploration on the 2-GPU host (session 4, second): the PMPI shim after its host fast
# path (shim_h200x2.sh, plus four more host-latency pairs for a median); Stencil2D
# overlap at 4096^2 again (three repetitions of 400 steps) and, where Nsight Systems is
# installed, a GPU trace of 60 steps of the 2-rank overlap run (where the residual goes).
# Usage: bash bench/gpu/explore3_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
export GPULMT_DEVICE=cuda
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
cat .gpu/commit > "$out/commit.txt"

log shim
bash bench/gpu/shim_h200x2.sh "$out" > /dev/null 2>&1
for i in 1 2 3 4; do
  timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 /tmp/cuda_osu host >> "$out/host_latency.csv" 2>&1
  timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda /tmp/cuda_osu host | sed 's/^cuda_osu/cuda_osu_shim/' >> "$out/host_latency.csv" 2>&1
done

log stencil overlap at 4096, three repetitions
bash bench/gpu/stencil_overlap.sh "$out" 3 400

nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$nsys" ]; then
  log "nsys trace ($nsys)"
  timeout 180 "$nsys" profile -o /tmp/st --trace=cuda --force-overwrite true $bin/gpulmt-run -n 2 --timeout 120 -- \
    $bin/stencil2d --size 4096 --halo 1 --precision single --mode inter-k-overlap --iters 60 > "$out/nsys_profile.txt" 2>&1
  timeout 120 "$nsys" stats --report cuda_gpu_trace --format csv -o /tmp/st_trace /tmp/st.nsys-rep > /dev/null 2>&1
  ls /tmp/st_trace* >> "$out/nsys_profile.txt" 2>&1
  f=$(ls /tmp/st_trace*.csv 2>/dev/null | head -1); [ -n "$f" ] && gzip -c "$f" > "$out/stencil_gpu_trace.csv.gz"
else
  echo "no nsys on this host" | tee -a "$out/log.txt"
fi
log done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
