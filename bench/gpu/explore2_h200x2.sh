#!/usr/bin/env bash
# Exploration on the 2-GPU host, beside the anchors of the same call (session 4):
#  - copy_probe: one 8 B / 16 KiB device copy, call by call (what the 8 B latency is made of),
#    and gpulmt's own copy+poll with each completion mode
#  - GPULMT_CUDA_COMPLETION (word, event; the word mode existed from 409cd5e and was removed
#    after this call measured it slower) x GPULMT_PROGRESS_ON_POST (1, 0): osu_latency,
#    osu_bw, osu_bibw per protocol
#  - Stencil2D overlap at 4096^2, three repetitions of every point (their spread)
#  - the PMPI shim (bench/gpu/shim_h200x2.sh), the CUDA unit tests, the quick checks
# Usage: bash bench/gpu/explore2_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
bin=.gpu/bin
run="$bin/gpulmt-run -n 2 --timeout 120 --"
export GPULMT_DEVICE=cuda NCCL_NVLS_ENABLE=0
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
cat .gpu/commit > "$out/commit.txt"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$out/host.txt" 2>&1

log anchors
bash .gpu/tools/anchors.sh 1073741824 > "$out/anchors.csv" 2> "$out/anchors.err"
log copy_probe
$bin/copy_probe 8 > "$out/copy_probe_8.csv" 2>&1
$bin/copy_probe 16384 > "$out/copy_probe_16k.csv" 2>&1

for v in word,1 event,1 word,0 event,0; do
  c=${v%,*}; p=${v#*,}
  export GPULMT_CUDA_COMPLETION=$c GPULMT_PROGRESS_ON_POST=$p
  log "completion=$c progress_on_post=$p"
  $run $bin/osu_latency -m 0:1M --csv "$out/v_${c}_$p.csv" D D > /dev/null
  $run $bin/osu_bw -m 256K:64M --csv "$out/v_${c}_$p.csv" D D > /dev/null
  for pr in get put auto; do $run $bin/osu_bibw -m 256K:64M --csv "$out/v_${c}_$p.csv" --protocol $pr D D > /dev/null; done
done
unset GPULMT_CUDA_COMPLETION GPULMT_PROGRESS_ON_POST

log stencil overlap at 4096, three repetitions
st() { n=$1; shift; $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" > /tmp/stencil.txt 2>&1 || { echo "FAILED: -n $n $*" >&2; tail -3 /tmp/stencil.txt >&2; }; }
for p in single double; do
  st 2 --size 512 --iters 20 --halo 4 --mode inter-k-overlap --precision "$p" --check --csv "$out/stencil_check.csv"
done
bash bench/gpu/stencil_overlap.sh "$out" 3 400

log shim
bash bench/gpu/shim_h200x2.sh "$out/shim" > /dev/null 2>&1
log cuda unit tests
$bin/gpulmt-unit --ignored --test-threads=1 device::cuda > "$out/unit.txt" 2>&1; echo "unit rc=$?" | tee -a "$out/log.txt"
log quick checks
bash bench/gpu/run_h200x2.sh quick "$out/quick" > /dev/null 2>&1
log done
{
  echo "# anchors: ce_latency peer us, ce_peer_bi GB/s at 4/16 MiB"
  grep -E "^ce_latency,peer|^ce_peer_bi,GBps,(4194304|16777216)," "$out/anchors.csv"
  echo "# copy_probe 8 B medians (us)"
  grep -E "push_memcpypeer_streamsync|ipc_pull_memcpy_(streamsync|eventquery|word)|gpulmt_copy_async_poll" "$out/copy_probe_8.csv" | cut -d, -f2,3
  echo "# variant: lat 8 B us | bw auto 4 MiB | bibw get/put/auto 4 MiB | auto 16 MiB"
  for f in "$out"/v_*.csv; do
    awk -F, -v n="$(basename "$f" .csv)" '$1=="osu_latency"&&$4==8{l=$6} $1=="osu_bw"&&$4==4194304{b=$6} $1=="osu_bibw"&&$4==4194304{bi[$3]=$6} $1=="osu_bibw"&&$4==16777216&&$3=="auto"{b16=$6} END{printf "%s %s | %s | %s/%s/%s | %s\n",n,l,b,bi["get"],bi["put"],bi["auto"],b16}' "$f"
  done
  grep -c ",ok" "$out/quick/check.csv" | sed 's/^/checks ok: /'; grep FAIL "$out/quick/check.csv"
  tail -2 "$out/shim/shim_log.txt" 2>/dev/null; tail -1 "$out/unit.txt"
} | tee "$out/summary.txt"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
