#!/usr/bin/env bash
# Why gpulmt's D D bandwidth across 2 pseudo-nodes on a host of two GPUs (one rank per GPU)
# stays at 0.61-0.67 of a hand-written staging pipeline, where on one H200 under MPS it
# reaches 0.88 (x2_targets.sh): osu_bw D D 4-16 MiB, 2 rounds, with the proxies' profiles,
# under variants: base (no MPS), mps (MPS started), chunk1M (GPULMT_NET_CHUNK=1M),
# depth16 (GPULMT_NET_DEPTH=16); then the hand-written pipeline at 4 MiB.
# Usage: bash lab/gpu/x2_bw.sh OUTDIR   (bw_<variant>_<round>.csv, profile_<variant>_<round>.txt)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: x2_bw.sh OUTDIR}"
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_LOG"
export GPULMT_LOG=warn,gpulmt_net_profile=info
run_bw() { # VARIANT ROUND [mpirun -x ...]
  local v=$1 r=$2; shift 2
  timeout 60 $pn "$@" -np 2 "$bin/osu_bw_mpi" -m 4M:16M --csv "$out/bw_${v}_$r.csv" D D > /dev/null \
    2> "$out/profile_${v}_$r.txt" || log "FAILED $v $r"
}
for r in 1 2; do
  run_bw base $r
  run_bw chunk1M $r -x GPULMT_NET_CHUNK=1M
  run_bw depth16 $r -x GPULMT_NET_DEPTH=16
  MPS=1 start_mps
  run_bw mps $r
  stop_mps; sleep 2
done
echo "mode,size,window,chunk,nbuf,threads,GBps" > "$out/staging_ceiling.csv"
build_staging_ceiling && timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 /tmp/staging_ceiling dd 4194304 64 524288 16 1 \
  < /dev/null >> "$out/staging_ceiling.csv" 2>> "$out/log.txt"
log done
