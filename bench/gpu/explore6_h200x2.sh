#!/usr/bin/env bash
# Session 5, third exploration: (1) Stencil2D at 4096^2: compute alone, inter-k, overlap,
# and with --no-exchange (the modes' compute without communication, 2 ranks), each also
# with --timeline (device times, read back after the run); (2) osu_latency D D with the
# sender's engine driving small GETs (GPULMT_GET_PUSH_MAX default) against the receiver's
# (=0): 8 B with OSU_ANATOMY, pinned, three runs each, and 8 B-256 KiB; osu_bw 4 KiB-1 MiB.
# Usage: bash bench/gpu/explore6_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
st() { n=$1; shift; $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" --csv "$out/stencil_raw.csv" > /tmp/st.txt 2>&1 || { echo "FAILED: -n $n $*"; tail -3 /tmp/st.txt; }; grep -h "^timeline\|^summary" /tmp/st.txt | sed "s|^|$n $* :: |" >> "$out/timeline.txt"; }
for p in single double; do for h in 1 4; do for tl in "" --timeline; do
  a="--size 4096 --halo $h --precision $p --iters 400 $tl"
  st 1 $a --mode inter-k
  st 2 $a --mode inter-k
  st 2 $a --mode inter-k-overlap
  st 2 $a --mode inter-k-overlap --no-exchange
  st 2 $a --mode inter-k --no-exchange
done; done; done
pin='exec taskset -c $((2 + 2 * GPULMT_RANK))'
for rep in 1 2 3; do for pm in 64K 0; do
  GPULMT_GET_PUSH_MAX=$pm OSU_ANATOMY=1 $bin/gpulmt-run -n 2 --timeout 60 -- sh -c "$pin $bin/osu_latency -m 8:8 -i 20000 --csv $out/lat_push$pm.csv D D" | grep anatomy | sed "s/^/push$pm,$rep,/" >> "$out/anatomy.csv"
done; done
for pm in 64K 0; do
  GPULMT_GET_PUSH_MAX=$pm $bin/gpulmt-run -n 2 --timeout 60 -- sh -c "$pin $bin/osu_latency -m 8:256K --csv $out/latsweep_push$pm.csv D D" > /dev/null
  GPULMT_GET_PUSH_MAX=$pm $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_bw -m 4K:1M --csv "$out/bw_push$pm.csv" D D > /dev/null
done
echo "== stencil per-step (us)"; grep -E "^[12] .*:: summary" "$out/timeline.txt" | sed -E 's/--size 4096 //; s/--iters 400 //; s/ \| comm share.*//'
echo "== timeline"; grep timeline "$out/timeline.txt" | grep "rank 0" | sed -E 's/ over .* batches, us after the batch.s start on the GPU//; s/--size 4096 //; s/--iters 400 //'
echo "== latency 8 B"; for pm in 64K 0; do echo "push $pm: $(grep ',8,' "$out/lat_push$pm.csv" | cut -d, -f6 | tr '\n' ' ')"; done
echo "== latency sweep"; paste -d, <(cut -d, -f4,6 "$out/latsweep_push64K.csv") <(cut -d, -f6 "$out/latsweep_push0.csv")
echo "== bw"; paste -d, <(cut -d, -f4,6 "$out/bw_push64K.csv") <(cut -d, -f6 "$out/bw_push0.csv")
echo "== anatomy medians, run 1"; grep -E "^push(64K|0),1,.*(half|one way|receive done)" "$out/anatomy.csv"
