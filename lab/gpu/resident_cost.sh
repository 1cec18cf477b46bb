#!/usr/bin/env bash
# What a resident, idle copy server costs another program's kernels on the same GPU: Stencil2D
# without exchanges (--no-exchange: kernels and stream waits only, no gpulmt copies) on two
# ranks at SIZES per rank, alone and beside one or two processes that each hold gpulmt's copy
# server resident (`SERVER_HOLD_MS=... server_probe`), in ROUNDS rotated rounds. Needs MPS
# (MPS=1) where the GPU is shared. Asks whether Stencil2D's inter-k at 4096² ran 5 % slower
# with a server that never left (h200x1/interk3, git history at c15a975) because of the
# server's mere presence.
# Then the other way round: server_probe's copies (engine, probe server, gpulmt's server)
# on an idle GPU and beside one rank of Stencil2D at 8192² (memory-bound kernels back to
# back), ROUNDS/2 rounds each: whether a busy GPU slows the server's copies more than the
# engine's.
# Usage: [ROUNDS=4] [MPS=1] [SIZES="2048 4096"] bash lab/gpu/resident_cost.sh OUTDIR
source "$(dirname "$0")/lab.sh"
start_mps
echo "mps=$mps" > "$out/env.txt"
echo "variant,round,size,time_per_iter_us" > "$out/resident.csv"
holders() { # count: starts them, waits until each says it holds its server
  local k
  for k in $(seq "$1"); do
    SERVER_HOLD_MS=4000 GPULMT_LOG=gpulmt=info $bin/server_probe 2> "/tmp/hold$k.txt" &
  done
  for k in $(seq "$1"); do
    for _ in $(seq 100); do grep -q holding "/tmp/hold$k.txt" && break; sleep 0.05; done
  done
}
resident_variant() { # name round holders
  local v=$1 r=$2 n=$3 s
  [ "$n" -gt 0 ] && holders "$n"
  for s in ${SIZES:-2048 4096}; do
    rm -f /tmp/resident.csv
    $bin/gpulmt-run -n 2 --timeout 60 -- $bin/stencil2d --size "$s" --halo 1 --mode inter-k --iters 500 \
      --no-exchange --csv /tmp/resident.csv > /tmp/resident.txt 2>&1 || { echo "FAILED: $v $s" >> "$out/log.txt"; tail -3 /tmp/resident.txt >> "$out/log.txt"; }
    echo "$v,$r,$s,$(grep ",time_per_iter_us," /tmp/resident.csv | cut -d, -f8)" >> "$out/resident.csv"
  done
  wait
  [ "$n" -gt 0 ] && grep -h "holding\|copy server stopped" /tmp/hold*.txt | sed "s/^/round $r $v: /" >> "$out/holders.txt"
  rm -f /tmp/hold*.txt
}
rotated_rounds "none:0 hold1:1 hold2:2" resident_variant 4
log "copies on a busy GPU"
for r in $(seq $(( (${ROUNDS:-4} + 1) / 2 ))); do
  $bin/server_probe 8 16384 2>> "$out/log.txt" | sed "s/^server_probe,/idle,$r,/" | grep -v "^probe" >> "$out/loaded.csv"
  # Long enough (about 6 s) to outlast the probe; left to end by itself: killing an MPS
  # client in the middle of a kernel once left the next client a sticky launch failure.
  $bin/gpulmt-run -n 1 --timeout 60 -- $bin/stencil2d --size 8192 --halo 1 --mode inter-k --iters 24000 --no-exchange > /tmp/busy.txt 2>&1 &
  sleep 1.5
  $bin/server_probe 8 16384 2>> "$out/log.txt" | sed "s/^server_probe,/busy,$r,/" | grep -v "^probe" >> "$out/loaded.csv"
  pgrep -f "stencil2d --size 8192" > /dev/null || echo "round $r: the stencil had ended before the probe did" >> "$out/log.txt"
  wait
done
stop_mps
log done
grep -E "_(8|16384)," "$out/loaded.csv" | grep -v check | cut -d, -f1-5 | sort -t, -k3,3 -k1,1 | tee "$out/loaded_table.txt"
median_table "$out/resident.csv" time_per_iter_us | tee "$out/resident_table.txt"
