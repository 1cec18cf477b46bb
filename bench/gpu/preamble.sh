# Sourced by the GPU harness (bench/gpu/run.sh) and the lab's GPU scripts (lab/gpu/lab.sh),
# as `source preamble.sh OUTDIR`: strict mode, $out from the first argument (created, with
# the commit of the carried binaries), $bin (BIN, default .gpu/bin), the device backend
# for every gpulmt run (GPULMT_DEVICE, default cuda), `log` (to stderr and $out/log.txt),
# `on_gpu`, `gpu_count`, `have_nvcc`, `start_mps`/`stop_mps`, `build_cuda_osu`,
# `build_cuda_mpi`, `build_staging_ceiling` and `net_anatomy`.
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=${BIN:-.gpu/bin}
# prepare.sh packs the binaries (a call carries 64 MiB); unpacked here once.
if [ ! -d .gpu/bin ] && [ -f .gpu/bin.tar.xz ]; then tar xJf .gpu/bin.tar.xz -C .gpu; fi
export GPULMT_DEVICE=${GPULMT_DEVICE:-cuda} NCCL_NVLS_ENABLE=0
if [ -f .gpu/commit ]; then cat .gpu/commit > "$out/commit.txt"; fi
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
# Whether gpulmt runs on real GPUs here (GPULMT_DEVICE=sim: the simulated devices).
on_gpu() { [ "$GPULMT_DEVICE" != sim ]; }
# How many GPUs this host shows (0 without nvidia-smi).
gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; }
# Whether nvcc is here (the anchors and the shim's CUDA programs need it); puts the CUDA
# toolkit's bin on PATH where it is installed but not on it.
have_nvcc() {
  [ -d "${CUDA_HOME:-/usr/local/cuda}/bin" ] && PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
  command -v nvcc >/dev/null 2>&1
}
# With MPS=1, starts NVIDIA MPS, so that ranks sharing a GPU run at once instead of being
# time-sliced; `mps` says whether it started. stop_mps ends it.
mps=0
start_mps() {
  [ "${MPS:-0}" = 1 ] && on_gpu || return 0
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/gpulmt-mps CUDA_MPS_LOG_DIRECTORY=/tmp/gpulmt-mpslog
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d 2>/dev/null && mps=1 && log "MPS started"
}
stop_mps() {
  if [ "$mps" = 1 ]; then echo quit | nvidia-cuda-mps-control; fi
  mps=0
}
# Builds the PMPI shim's example application (ffi/shim/examples/cuda_osu.c) with the host's
# mpicc and CUDA into /tmp/cuda_osu.
build_cuda_osu() {
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  mpicc -O2 -I$cuda/include ffi/shim/examples/cuda_osu.c -L$cuda/lib64 -lcudart -Wl,-rpath,$cuda/lib64 -o /tmp/cuda_osu
}

# Builds a CUDA + MPI program SRC (.cu) with nvcc and the host's Open MPI into OUT; its
# errors go to log.txt. Usage: build_cuda_mpi SRC OUT (fails without nvcc or mpicc)
build_cuda_mpi() {
  have_nvcc || return 1
  local inc libs
  inc=$(mpicc --showme:incdirs | tr ' ' '\n' | sed 's/^/-I/' | tr '\n' ' ')
  libs=$(mpicc --showme:libdirs | tr ' ' '\n' | sed 's/^/-L/' | tr '\n' ' ')
  # shellcheck disable=SC2086 # lists of options
  nvcc -O2 -std=c++17 $inc "$1" -o "$2" $libs -lmpi 2>> "$out/log.txt"
}

# Builds the staging pipeline's ceiling (bench/gpu/staging_ceiling.cu: a hand-written D D
# pipeline around MPI, without gpulmt) into /tmp/staging_ceiling.
build_staging_ceiling() { build_cuda_mpi bench/gpu/staging_ceiling.cu /tmp/staging_ceiling; }

# Where one D D leg across 2 pseudo-nodes goes, step by step: runs PROG (osu_latency built
# with the transport's `anatomy` feature) for ITERS legs of BYTES under LAUNCH (mpirun and
# its options, one string; it must pass GPULMT_ANATOMY_OUT on), and writes the steps'
# medians (bench/gpu/anatomy_net.py) to CSV; the raw logs go. Fails if either step does.
# Usage: net_anatomy PROG BYTES ITERS "LAUNCH" CSV
net_anatomy() {
  local prog=$1 bytes=$2 iters=$3 launch=$4 csv=$5 raw rc
  raw=$(mktemp -d /tmp/gpulmt-anatomy.XXXXXX)
  # shellcheck disable=SC2086 # LAUNCH is a command line
  GPULMT_ANATOMY_OUT="$raw/net" timeout 300 $launch -np 2 -x GPULMT_ANATOMY_OUT "$prog" -m "$bytes:$bytes" -i "$iters" D D \
    > /dev/null 2>> "$out/log.txt" && python3 bench/gpu/anatomy_net.py "$raw/net" > "$csv" 2>> "$out/log.txt"
  rc=$?
  rm -rf "$raw"
  return $rc
}
