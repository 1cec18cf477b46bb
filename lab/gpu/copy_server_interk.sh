#!/usr/bin/env bash
# Why Stencil2D's inter-k steps ran 9-16 % slower with the copy server in one call
# (h200x1/copy_server4) and not in another (copy_server5_timeline, with --timeline): ROUNDS
# rotated rounds of inter-k, halo 1, at SIZES per rank, two ranks, in variants that each
# remove one suspect:
#   off / on            engine / server up to 64 KiB (idle timeout 100 us, the default)
#   on_idle20           the server leaves 20 us after a copy: gone during the compute
#   on_idle5000         it stays through the compute: never relaunched
#   off_conn32/on_conn32  CUDA_DEVICE_MAX_CONNECTIONS=32: fewer streams share a hardware
#                       queue (a resident kernel blocks what queues behind it in one)
#   off_tl / on_tl      --timeline (CUDA events at each batch's marks; prints GPU times)
# then one --host-intervals run each of off and on (their distributions into the log).
# VARIANTS="name:VAR=1,VAR2=2:--arg ..." replaces that list. Each run's copy-server totals
# (copies, declined to the engine, launches) go to notes.txt, the first round's outputs to
# output_VARIANT_SIZE.txt. MPS=1 starts MPS (two ranks
# on one GPU need it for the server).
# MODE=inter-k-overlap runs that mode instead.
# Usage: [ROUNDS=6] [MPS=1] [SIZES="2048 4096"] [VARIANTS=...] [MODE=inter-k] bash lab/gpu/copy_server_interk.sh OUTDIR
source "$(dirname "$0")/lab.sh"
start_mps
echo "mps=$mps" > "$out/env.txt"
on=GPULMT_COPY_SERVER_MAX=64K
variants=${VARIANTS:-"off:X=1: on:$on: on_idle20:$on,GPULMT_COPY_SERVER_IDLE_US=20:
  on_idle5000:$on,GPULMT_COPY_SERVER_IDLE_US=5000: off_conn32:CUDA_DEVICE_MAX_CONNECTIONS=32:
  on_conn32:$on,CUDA_DEVICE_MAX_CONNECTIONS=32: off_tl:X=1:--timeline on_tl:$on:--timeline"}
echo "variant,round,size,time_per_iter_us,comm_share_pct" > "$out/interk.csv"
stencil() { # variant envs extra-args size
  local v=$1 envs=${2//,/ } extra=$3 s=$4
  rm -f /tmp/interk.csv
  # shellcheck disable=SC2086
  env GPULMT_LOG=gpulmt=warn,gpulmt::device::cuda::copy_server=info $envs $bin/gpulmt-run -n 2 --timeout 120 -- $bin/stencil2d --size "$s" --halo 1 \
    --mode "${MODE:-inter-k}" --iters 500 --csv /tmp/interk.csv $extra > /tmp/interk.txt 2>&1 \
    || { echo "FAILED: $v $s" >> "$out/log.txt"; tail -3 /tmp/interk.txt >> "$out/log.txt"; }
  grep -h "timeline:\|copy server stopped\|WARN\|ERROR" /tmp/interk.txt | sed "s/^/$v $s: /" >> "$out/notes.txt"
}
interk_variant() { # name round envs [extra-args]
  local v=$1 r=$2 s t c
  for s in ${SIZES:-2048 4096}; do
    stencil "$v" "${3:-}" "${4:-}" "$s"
    [ "$r" = 1 ] && cp /tmp/interk.txt "$out/output_${v}_$s.txt"
    t=$(grep ",time_per_iter_us," /tmp/interk.csv | cut -d, -f8)
    c=$(grep ",comm_share_pct," /tmp/interk.csv | cut -d, -f8)
    echo "$v,$r,$s,$t,$c" >> "$out/interk.csv"
  done
}
rotated_rounds "$variants" interk_variant 6
for v in off on; do
  e=X=1; [ $v = on ] && e=$on
  stencil "$v" "$e" --host-intervals 2048
  grep -h "host intervals" /tmp/interk.txt | sed "s/^/$v 2048: /" >> "$out/notes.txt"
done
stop_mps
log done
median_table "$out/interk.csv" time_per_iter_us comm_share_pct | tee "$out/interk_table.txt"
