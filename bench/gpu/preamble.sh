# Sourced by the GPU scripts (`source "$(dirname "$0")/preamble.sh"`, arguments passed on):
# strict mode, $out from the first argument (created, with the commit of the carried
# binaries), $bin, the CUDA backend for every gpulmt run, `log` (to stderr and
# $out/log.txt), `small_copy_baselines` and `append_rows`.
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
export GPULMT_DEVICE=cuda
if [ -f .gpu/commit ]; then cat .gpu/commit > "$out/commit.txt"; fi
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
# The small-copy ceilings of this call, for scripts about the 8 B latency: the host's
# GPUs, the anchors' 8 B copy-and-wait and copy_probe 8.
small_copy_baselines() {
  nvidia-smi > "$out/host.txt" 2>&1
  log anchors
  bash .gpu/tools/anchors.sh 8 > "$out/anchors.csv" 2> "$out/anchors.err"
  log copy_probe
  $bin/copy_probe 8 > "$out/copy_probe_8.csv" 2>> "$out/log.txt"
}
# Appends the rows of an osu benchmark's --csv file ($3) to $4 as
# `variant,round,bench,bytes,metric,value` (variant $1, round $2; its header, placement
# and protocol columns dropped).
append_rows() {
  tail -n +2 "$3" 2>/dev/null | cut -d, -f1,4- | sed "s/^/$1,$2,/" >> "$4"
}
