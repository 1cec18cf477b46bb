#!/usr/bin/env bash
# Stencil2D with the copy server (GPULMT_COPY_SERVER_MAX=64K) against without it: first
# the bit-identical checks with it on (inter-k and inter-k-overlap, single and double, 2
# ranks), then ROUNDS alternating timed runs of inter-k and inter-k-overlap at SIZES per
# rank, halo 1 (rows of 8-32 KiB: copies the server takes). MPS=1 starts MPS (two ranks on
# one GPU need it for the server). Usage: [ROUNDS=3] [MPS=1] [SIZES="2048 4096"]
# bash lab/gpu/copy_server_stencil.sh OUTDIR   (after prepare.sh; carry .gpu)
source "$(dirname "$0")/lab.sh"
start_mps
run() { # variant env args...
  local v=$1 e=$2; shift 2
  env $e $bin/gpulmt-run -n 2 --timeout 120 -- $bin/stencil2d "$@" > /tmp/stencil.txt 2>&1 || { echo "FAILED: $v $*" | tee -a "$out/log.txt"; tail -3 /tmp/stencil.txt >> "$out/log.txt"; }
}
for m in inter-k inter-k-overlap; do for p in single double; do
  run check GPULMT_COPY_SERVER_MAX=64K --size 512 --iters 20 --halo 4 --mode $m --precision $p --check --csv "$out/stencil_check.csv"
done; done
for r in $(seq "${ROUNDS:-3}"); do
  log round $r
  for s in ${SIZES:-2048 4096}; do for m in inter-k inter-k-overlap; do
    run off X=1 --size $s --halo 1 --mode $m --iters 500 --csv "$out/stencil_off.csv"
    run on GPULMT_COPY_SERVER_MAX=64K --size $s --halo 1 --mode $m --iters 500 --csv "$out/stencil_on.csv"
  done; done
done
stop_mps
log done
head -1 "$out/stencil_check.csv"; cut -d, -f1-12 "$out/stencil_check.csv" | tail -n +2
for v in off on; do echo "== $v"; head -1 "$out/stencil_$v.csv"; tail -n +2 "$out/stencil_$v.csv"; done
