#!/usr/bin/env bash
# Issue 27's open targets across 2 pseudo-nodes on one GPU, in one call: where an 8 B D D
# leg's time goes (anatomy, copy server on and off), D D latency beside the host-staged
# anchor, and why D D bandwidth stays below Open MPI H H over vader (Open MPI alone against
# how many distinct buffers a window cycles through; osu_bw D D against its window).
# Usage: bash lab/gpu/net_probe.sh OUTDIR   (PARTS="anatomy lat buffers bw" by default; "cma": the
# same under Open MPI's CMA single copy; "tcp": osu_bw D D over TCP against the piece size and
# depth, TCP_SETTINGS="CHUNK/DEPTH ..."; "vaderbw": the same over vader, VADER_SETTINGS; "pipelat": osu_latency 64K-16M per
# PIPE_SETTINGS over both transports)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_probe.sh OUTDIR}"
parts=${PARTS:-anatomy lat buffers bw}
# The anatomy runs log each copy server's tally (copies served, declined, launches) at exit.
export GPULMT_LOG=${GPULMT_LOG:-warn,gpulmt::device=info}
has() { [[ " $parts " == *" $1 "* ]]; }
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
pn="$mpirun -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_COPY_SERVER_MAX"
tools=.gpu/tools
have_nvcc || log "no nvcc: the anchor and mpi_buffers are skipped"
{ lscpu | grep -E 'Model name|^CPU\(s\)|L3|L2|NUMA node\(s\)'; ompi_info --param btl vader --level 9 2>/dev/null \
  | grep -E 'single_copy|eager_limit|max_send_size'; } > "$out/host.txt" 2>&1
MPS=1 start_mps
if has anatomy; then
  for s in 64K 0; do
    log "anatomy, GPULMT_COPY_SERVER_MAX=$s"
    GPULMT_COPY_SERVER_MAX=$s net_anatomy "$bin/osu_latency_anatomy_mpi" 8 5000 "$pn -x GPULMT_LOG" "$out/anatomy_$s.csv"
  done
fi
if has lat; then
  for s in 64K 0; do
    log "osu_latency D D, GPULMT_COPY_SERVER_MAX=$s"
    GPULMT_COPY_SERVER_MAX=$s timeout 120 $pn -np 2 "$bin/osu_latency_mpi" -m 0:64K --csv "$out/lat_$s.csv" D D \
      > /dev/null 2>> "$out/log.txt"
  done
  log "host-staged anchor"
  have_nvcc && timeout 150 bash $tools/staged_mpi.sh 64K > "$out/staged_mpi.csv" 2>> "$out/log.txt"
fi
if has buffers && have_nvcc; then
  log "Open MPI H H against the buffers a window cycles through"
  build_cuda_mpi lab/gpu/mpi_buffers.cu /tmp/mpi_buffers
  echo "size,window,buffers,memory,GBps" > "$out/buffers.csv"
  for sz in 1048576 4194304; do
    for nb in 1 4 16 64; do
      timeout 60 $mpirun -np 2 /tmp/mpi_buffers $sz 64 $nb pinned >> "$out/buffers.csv" 2>> "$out/log.txt"
    done
    timeout 60 $mpirun -np 2 /tmp/mpi_buffers $sz 64 64 pageable >> "$out/buffers.csv" 2>> "$out/log.txt"
  done
fi
if has bw; then
  for w in 64 8 2; do
    log "osu_bw D D, window $w"
    GPULMT_LOG=warn,gpulmt_net_profile=info GPULMT_COPY_SERVER_MAX=0 timeout 150 $pn -x GPULMT_LOG -np 2 \
      "$bin/osu_bw_mpi" -W $w -m 1048576:67108864 --csv "$out/bw_DD_W$w.csv" D D > /dev/null 2> "$out/profile_W$w.txt"
  done
  log "osu_bw H H, window 64"
  GPULMT_COPY_SERVER_MAX=0 timeout 150 $pn -np 2 "$bin/osu_bw_mpi" -m 1048576:67108864 --csv "$out/bw_HH.csv" H H \
    > /dev/null 2>> "$out/log.txt"
fi
if has tcp; then
  # The pipeline's piece size and depth over Open MPI's TCP transport (the real network's
  # stand-in): osu_bw D D 4-64 MiB per setting.
  for cd in ${TCP_SETTINGS:-1M/4 1M/8 1M/16 512K/8 2M/8}; do
    c=${cd%/*} d=${cd#*/}
    log "osu_bw D D over tcp, GPULMT_NET_CHUNK=$c GPULMT_NET_DEPTH=$d"
    GPULMT_COPY_SERVER_MAX=0 timeout 150 $pn --mca btl tcp,self -x GPULMT_NET_CHUNK=$c -x GPULMT_NET_DEPTH=$d -np 2 "$bin/osu_bw_mpi" \
      -m 4194304:67108864 --csv "$out/tcp_bw_${c}_$d.csv" D D > /dev/null 2>> "$out/log.txt"
  done
fi
if has vaderbw; then
  # The same settings over vader (shared memory).
  for cd in ${VADER_SETTINGS:-1M/4 512K/8}; do
    c=${cd%/*} d=${cd#*/}
    log "osu_bw D D over vader, GPULMT_NET_CHUNK=$c GPULMT_NET_DEPTH=$d"
    GPULMT_COPY_SERVER_MAX=0 timeout 150 $pn -x GPULMT_NET_CHUNK=$c -x GPULMT_NET_DEPTH=$d -np 2 "$bin/osu_bw_mpi" \
      -m 4194304:67108864 --csv "$out/vader_bw_${c}_$d.csv" D D > /dev/null 2>> "$out/log.txt"
  done
fi
if has pipelat; then
  # Large-message latency against the pipeline's settings, in one call (A/B).
  for cd in ${PIPE_SETTINGS:-1M/4 512K/8}; do
    c=${cd%/*} d=${cd#*/}
    for t in vader tcp; do
      mca=$([ $t = tcp ] && echo "--mca btl tcp,self")
      log "osu_latency D D and H H 64K-16M over $t, GPULMT_NET_CHUNK=$c GPULMT_NET_DEPTH=$d"
      for pl in "D D" "H H"; do
        GPULMT_COPY_SERVER_MAX=0 timeout 100 $pn $mca -x GPULMT_NET_CHUNK=$c -x GPULMT_NET_DEPTH=$d -np 2 \
          "$bin/osu_latency_mpi" -m 65536:16777216 --csv "$out/pipelat_${t}_${c}_${d}_${pl// /}.csv" $pl \
          > /dev/null 2>> "$out/log.txt"
      done
    done
  done
fi
if has cma && have_nvcc; then
  # Open MPI's single-copy mechanism (this host's environment sets none): both the H H
  # reference and gpulmt's D D under the same setting.
  log "vader with CMA single copy"
  export OMPI_MCA_btl_vader_single_copy_mechanism=cma
  [ -x /tmp/mpi_buffers ] || build_cuda_mpi lab/gpu/mpi_buffers.cu /tmp/mpi_buffers
  echo "size,window,buffers,memory,GBps" > "$out/buffers_cma.csv"
  for nb in 1 16 64; do
    timeout 60 $mpirun -np 2 /tmp/mpi_buffers 4194304 64 $nb pinned >> "$out/buffers_cma.csv" 2>> "$out/log.txt"
  done
  GPULMT_COPY_SERVER_MAX=0 timeout 150 $pn -np 2 "$bin/osu_bw_mpi" -m 1048576:67108864 --csv "$out/bw_DD_cma.csv" D D \
    > /dev/null 2>> "$out/log.txt"
  unset OMPI_MCA_btl_vader_single_copy_mechanism
fi
stop_mps
log "done"
