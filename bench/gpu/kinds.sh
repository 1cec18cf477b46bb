#!/usr/bin/env bash
# Every kind of device memory an application hands to gpulmt (issue 45, docs/memory-kinds.md),
# on one host in one call: correctness first, then speed beside the anchors.
#
# Usage (repository root, binaries from bench/gpu/prepare.sh carried in .gpu/):
#   bash bench/gpu/kinds.sh OUTDIR            KINDS_PARTS="checks shim bench" by default
# Parts:
#   checks  gpulmt-check pingpong on the real allocations through gpulmt's API: every kind
#           (legacy, pool, pool-ipc, vmm, vmm-ipc, vmm-ipc:3, managed) on both ranks x every
#           protocol (auto get put coop shm) x sizes 0, 8 B, 64 KiB + 1, 4 MiB, 64 MiB + 3;
#           mixed pairs; three rounds of free and reallocate at one size (a pool gives the same
#           address back); the protocols and the staged counts each rank printed (check.csv,
#           counts.txt)
#   shim    ffi/shim/examples/mem_kinds.c under the PMPI shim (every pair of kinds, the
#           byte checks, 10000 allocate/send/free cycles of shareable pool memory with the
#           GPU's free memory before and after), and the same program under plain Open MPI
#           for what a user has without gpulmt (shim_mem_kinds.csv, plain_mem_kinds.txt)
#   bench   osu_bw and osu_latency D D per kind in rotated rounds (KINDS_ROUNDS, default 2),
#           legacy in every round, beside copy_pingpong (the copy-engine floor), the SHM path
#           forced on legacy memory, and the host's pinned staging ceiling
#           (bench/gpu/pinned_staging.py); kinds_bw.csv, kinds_lat.csv, anchors.csv, kinds_summary.txt
# Two ranks share the GPU under MPS (MPS=1 is the default here).
set -uo pipefail
export MPS=${MPS:-1}
source "$(dirname "$0")/preamble.sh" "${1:?usage: bash bench/gpu/kinds.sh OUTDIR}"
parts=${KINDS_PARTS:-checks shim bench}
# Shareable pools cross by IPC (GPULMT_POOL_IPC, 1 unless set): every part, the shim's too,
# runs with the value set here.
export GPULMT_POOL_IPC=${GPULMT_POOL_IPC:-1}
run="$bin/gpulmt-run -n 2 --timeout 240 --"
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
kinds="legacy pool pool-ipc vmm vmm-ipc vmm-ipc:3 managed"
sizes=0,8,65537,4194304,67108867
start_mps
trap stop_mps EXIT

# One pingpong job; a line of check.csv, and the ranks' protocol and staged counts.
pingpong() {
  local k0=$1 k1=$2 proto=$3 list=$4 tag=$5 log rc
  log=$(mktemp /tmp/gpulmt-kinds.XXXXXX)
  timeout 100 $bin/gpulmt-run -n 2 --timeout 90 -- $bin/gpulmt-check pingpong --placement "D D" --sizes "$list" --mem0 "$k0" --mem1 "$k1" \
    > "$log" 2>&1
  rc=$?
  local ok=FAIL
  [ $rc = 0 ] && [ "$(grep -c ' ok pingpong' "$log")" = 2 ] && ok=ok
  echo "$tag,$k0,$k1,$proto,$ok" >> "$out/check.csv"
  { echo "== $tag $k0 $k1 $proto rc=$rc"; grep -E ' protocols | kinds |FAIL' "$log"; } >> "$out/counts.txt"
  [ $ok = ok ] || { echo "== $tag $k0 $k1 $proto" >> "$out/failures.txt"; tail -20 "$log" >> "$out/failures.txt"; }
  rm -f "$log"
}

checks() {
  log "checks: every kind x protocol"
  local k p
  for k in $kinds; do
    for p in auto get put coop shm; do
      GPULMT_PROTOCOL=$p pingpong "$k" "$k" "$p" "$sizes" kinds
    done
  done
  log "checks: mixed pairs, and three rounds at one size"
  for pair in "pool-ipc legacy" "legacy pool-ipc" "pool legacy" "legacy pool" "managed legacy" "legacy managed" \
    "vmm-ipc:3 pool-ipc" "managed pool-ipc"; do
    # shellcheck disable=SC2086 # two words
    GPULMT_PROTOCOL=auto pingpong $pair auto "$sizes" mixed
  done
  for k in pool pool-ipc vmm-ipc managed; do
    GPULMT_PROTOCOL=auto pingpong "$k" "$k" auto 4194304,4194304,4194304,65537,65537,65537 rounds
  done
  log "checks: $(grep -c ',ok$' "$out/check.csv") ok, $(grep -c ',FAIL$' "$out/check.csv") failed"
}

shim() {
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  if ! have_nvcc || ! command -v mpicc >/dev/null 2>&1; then
    log "skipped: shim (needs the CUDA toolkit and mpicc)"
    return
  fi
  mpicc -O2 -I$cuda/include ffi/shim/examples/mem_kinds.c -L$cuda/lib64 -lcudart -lcuda -Wl,-rpath,$cuda/lib64 \
    -o /tmp/mem_kinds 2>> "$out/log.txt" || { log "mem_kinds did not build"; return; }
  log "shim: mem_kinds, 2 ranks"
  timeout 200 $mpirun -np 2 -x GPULMT_POOL_IPC -x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda -x GPULMT_LOG=info \
    /tmp/mem_kinds 10000 > "$out/shim_mem_kinds.csv" 2> "$out/shim_mem_kinds.err"
  echo "shim_mem_kinds,rc=$?" >> "$out/check.csv"
  log "shim: mem_kinds, 4 ranks"
  timeout 150 $mpirun -np 4 -x GPULMT_POOL_IPC -x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda \
    /tmp/mem_kinds 2000 > "$out/shim_mem_kinds_np4.csv" 2> "$out/shim_mem_kinds_np4.err"
  echo "shim_mem_kinds_np4,rc=$?" >> "$out/check.csv"
  log "plain Open MPI (not CUDA-aware): mem_kinds, 2 ranks, no cycles"
  timeout 60 $mpirun -np 2 /tmp/mem_kinds 0 > "$out/plain_mem_kinds.txt" 2>&1
  echo "plain_mem_kinds,rc=$?" >> "$out/check.csv"
}

bench() {
  local r k
  if [ -x "$bin/copy_pingpong" ]; then
    log copy_pingpong
    $bin/copy_pingpong -m 1:4M -i 5000 > "$out/copy_pingpong.csv" 2>> "$out/log.txt"
  fi
  log "pinned staging ceiling"
  # anchors.cu's staging rows need two GPUs; this measures the same copies on any host.
  python3 bench/gpu/pinned_staging.py 67108864 > "$out/anchors.csv" 2> "$out/anchors.err"
  for r in $(seq 1 "${KINDS_ROUNDS:-2}"); do
    # Rotated: each round starts with another kind.
    local order
    order=$(echo legacy pool pool-ipc vmm-ipc managed | tr ' ' '\n' | awk -v r="$r" '{a[NR]=$0} END {for (i=0;i<NR;i++) print a[(i+r-1)%NR+1]}')
    for k in $order; do
      log "bench round $r: $k"
      $run $bin/osu_bw -m 1M:64M --mem "$k" --stats --csv /tmp/bw.csv D D > "$out/bw_${k}_$r.txt" 2>&1
      sed "s/^/$k,$r,/" /tmp/bw.csv >> "$out/kinds_bw.csv"; rm -f /tmp/bw.csv
      $run $bin/osu_latency -m 8:4M --mem "$k" --csv /tmp/lat.csv D D > /dev/null 2>&1
      sed "s/^/$k,$r,/" /tmp/lat.csv >> "$out/kinds_lat.csv"; rm -f /tmp/lat.csv
    done
    log "bench round $r: legacy through the SHM path"
    $run $bin/osu_bw -m 1M:64M --protocol shm --csv /tmp/bw.csv D D > /dev/null 2>&1
    sed "s/^/legacy-shm,$r,/" /tmp/bw.csv >> "$out/kinds_bw.csv"; rm -f /tmp/bw.csv
  done
  python3 bench/gpu/kinds_summary.py "$out" > "$out/kinds_summary.txt" 2>> "$out/log.txt"
}

for p in $parts; do $p; done
log done
