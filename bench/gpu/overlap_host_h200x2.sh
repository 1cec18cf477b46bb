#!/usr/bin/env bash
# Session 5's closing checks of two targets on the 2-GPU host, in one call:
# (1) Stencil2D's overlap at 4096^2 (stencil_overlap.sh, 3 x 400 steps), plus the same
#     2-rank jobs without communication (--no-exchange: inter-k and overlap structure),
#     the baseline that isolates what two ranks cost by themselves, and --check runs of
#     the overlap mode (2 ranks h1/h4 both precisions, 4 ranks on 2x2 h1/h2);
# (2) the PMPI shim's host 8 B latency against plain Open MPI, nine alternating runs.
# Usage: bash bench/gpu/overlap_host_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/stencil_overlap.sh "$out" 3 400
for rep in 1 2 3; do for p in single double; do for h in 1 4; do for m in inter-k inter-k-overlap; do
  $bin/gpulmt-run -n 2 --timeout 120 -- $bin/stencil2d --size 4096 --halo $h --precision $p --mode $m --iters 400 --no-exchange 2>&1 \
    | grep "^summary" | sed -E "s/^summary: ([0-9.]+) us.*/$p,$h,$m,\1/" >> "$out/no_exchange.csv"
done; done; done; done
bash bench/gpu/stencil_overlap_check.sh "$out"
HOSTLAT_REPS=9 bash bench/gpu/hostlat_h200x2.sh "$out/hostlat" > /dev/null 2>&1
echo "== stencil overlap"; $bin/bench-report "$out" 2>&1 | grep -A9 "overlap against compute alone" | tail -5
echo "== 2 ranks without communication (us/step, 3 runs)"; sort "$out/no_exchange.csv" | awk -F, '{k=$1" h"$2" "$3; a[k]=a[k]" "$4} END{for(k in a) print k":"a[k]}' | sort
echo "== checks"; cut -c1-60 "$out/check.txt"
echo "== host latency (us)"; for v in plain plain_2comms shim; do echo "$v: $(grep "^$v," "$out/hostlat/hostlat.csv" | cut -d, -f4 | tr '\n' ' ')"; done
