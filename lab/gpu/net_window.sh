#!/usr/bin/env bash
# Whether D D bandwidth over vader across 2 pseudo-nodes depends on how many bounce buffers
# the proxies cycle through: osu_bw 4-64 MiB with osu's window 64, 16, 8 and 4 (a window of
# 64 transfers holds 90-odd staging buffers of 512 KiB, one per transfer at least), and at
# window 8 with other pieces (GPULMT_NET_CHUNK) and depths (GPULMT_NET_DEPTH); H H beside
# them and Open MPI's own H H (staged_mpi.sh host). bw_<placement>_W<window>_<chunk>_<depth>.csv
# and the proxies' profiles; OUTDIR.tgz after each step. About a minute.
# Usage: bash lab/gpu/net_window.sh OUTDIR   (binaries of bench/gpu/prepare.sh in .gpu/bin)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_window.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_NET_CHUNK -x GPULMT_NET_DEPTH -x GPULMT_LOG"
export GPULMT_LOG=warn,gpulmt_net_profile=info
MPS=1 start_mps
have_nvcc && timeout 60 bash .gpu/tools/staged_mpi.sh 67108864 host > "$out/host.csv" 2>> "$out/log.txt"
for spec in "D D 64 512K 8" "D D 16 512K 8" "D D 8 512K 8" "D D 4 512K 8" "H H 64 512K 8" "H H 8 512K 8" "D D 8 512K 4" "D D 8 256K 8" "D D 8 1M 4" "D D 16 256K 4"; do
  # shellcheck disable=SC2086 # the spec is five words
  set -- $spec
  tag="$1$2_W$3_$4_$5"
  log "osu_bw $tag"
  GPULMT_NET_CHUNK=$4 GPULMT_NET_DEPTH=$5 timeout 40 $pn -np 2 "$bin/osu_bw_mpi" --large-budget 1G -W $3 -m 4M:64M --csv "$out/bw_$tag.csv" $1 $2 > /dev/null 2> "$out/profile_$tag.txt" || log "FAILED $tag"
  pack
done
stop_mps; log done; pack
