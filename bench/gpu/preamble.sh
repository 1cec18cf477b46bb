# Sourced by the GPU scripts (`source "$(dirname "$0")/preamble.sh"`, arguments passed on):
# strict mode, $out from the first argument (created, with the commit of the carried
# binaries), $bin, and the CUDA backend for every gpulmt run.
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
export GPULMT_DEVICE=cuda
if [ -f .gpu/commit ]; then cat .gpu/commit > "$out/commit.txt"; fi
