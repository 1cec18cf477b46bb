#!/usr/bin/env bash
# Session 5 exploration on the 2-GPU host: (1) copy_probe 8 and 4096 with the new
# ipc_push variant (a GET driven by the source GPU's engine from the receiving process);
# (2) Stencil2D at 4096^2 with --timeline (device times of the first kernel, the comm
# queue and the batch end, and the idle gap between batches), compute alone, inter-k and
# overlap, single and double, halo 1 and 4; (3) osu_latency D D 8 B, three runs.
# Usage: bash bench/gpu/explore4_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
for n in 8 4096; do timeout 120 $bin/copy_probe $n > "$out/copy_probe_$n.csv" 2> "$out/copy_probe_$n.err"; done
st() { n=$1; shift; $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" --csv "$out/stencil.csv" > /tmp/stencil.txt 2>&1 || { echo "FAILED: -n $n $*" >&2; tail -3 /tmp/stencil.txt >&2; }; grep -h "^timeline\|^summary" /tmp/stencil.txt | sed "s|^|$n $* :: |" >> "$out/timeline.txt"; }
for p in single double; do for h in 1 4; do
  for tl in "" --timeline; do
    st 1 --size 4096 --halo "$h" --precision "$p" --mode inter-k --iters 400 $tl
    st 2 --size 4096 --halo "$h" --precision "$p" --mode inter-k --iters 400 $tl
    st 2 --size 4096 --halo "$h" --precision "$p" --mode inter-k-overlap --iters 400 $tl
  done
done; done
for rep in 1 2 3; do
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/lat.csv" D D > /dev/null
done
echo "== copy_probe 8 (selected)"; grep -E "ipc_|push_memcpy_eventquery|push_gpulmt" "$out/copy_probe_8.csv"
echo "== copy_probe 4096 (selected)"; grep -E "ipc_.*(eventquery|gpulmt|data|cross)" "$out/copy_probe_4096.csv"
echo "== timeline"; grep timeline "$out/timeline.txt" | sed 's/ over .* batches, us after the batch.s start on the GPU//'
echo "== latency 8 B"; grep ',8,' "$out/lat.csv" | cut -d, -f6 | tr '\n' ' '; echo
