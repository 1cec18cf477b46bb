#!/usr/bin/env bash
# Where the PMPI shim's D D latency across 2 pseudo-nodes goes, against gpulmt's own API on
# the same path, on one GPU under MPS, in one call:
#   lat_<round>.csv         D D latency at each of SIZES (default "8 65536 1048576 4194304"),
#                           cuda_osu under the shim (`cuda_osu lat BYTES`) and osu_latency_mpi,
#                           ROUNDS rounds (default 2), the two programs in alternation (A B, B A)
#   trace_{shim,own}_<bytes>.csv  every anatomy point of a leg in time order
#                           (lab/gpu/anatomy_trace.py) at TRACE_SIZES (default "65536 1048576"):
#                           the shim built with gpulmt/anatomy (libgpulmt_mpi_anatomy.so, its
#                           envelope and matching steps are `shim:` probes), osu_latency_anatomy_mpi
#   staged_mpi.csv, host_mpi.csv   the host-staged anchor and Open MPI's own H H
# All in OUTDIR.tgz.
# Usage: bash lab/gpu/shim_trace.sh OUTDIR   (binaries in .gpu/bin, anchors in .gpu/tools)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: shim_trace.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
pn="$mpirun -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_COPY_SERVER_MAX=0 ${MPI_X:-}"
iters() { if [ "$1" -ge 4194304 ]; then echo 500; elif [ "$1" -ge 1048576 ]; then echo 1000; else echo 4000; fi; }
shim_lat() { # BYTES LIB: one row "shim,BYTES,us"
  # shellcheck disable=SC2086
  timeout 120 $pn -np 2 -x LD_PRELOAD="$PWD/$bin/$2" /tmp/cuda_osu lat "$1" "$(iters "$1")" 2>> "$out/log.txt" \
    | awk -F, -v b="$1" '$2 == "lat" {print "shim," b "," $6}'
}
own_lat() { # BYTES: one row "own,BYTES,us"
  rm -f /tmp/own_lat.csv # osu_latency appends to its --csv file
  timeout 120 $pn -np 2 "$bin/osu_latency_mpi" -m "$1:$1" -i "$(iters "$1")" --csv /tmp/own_lat.csv D D > /dev/null 2>> "$out/log.txt" \
    && awk -F, -v b="$1" '$5 == "us" {print "own," b "," $6}' /tmp/own_lat.csv
}
MPS=1 start_mps
build_cuda_osu || log "cuda_osu did not build"
timeout 90 bash .gpu/tools/staged_mpi.sh 4194304 > "$out/staged_mpi.csv" 2>> "$out/log.txt" || log "staged FAILED"
timeout 90 bash .gpu/tools/staged_mpi.sh 4194304 host > "$out/host_mpi.csv" 2>> "$out/log.txt" || log "host FAILED"
for r in $(seq "${ROUNDS:-2}"); do
  log "round $r"
  echo "who,bytes,us" > "$out/lat_$r.csv"
  for s in ${SIZES:-8 65536 1048576 4194304}; do
    if [ $((r % 2)) = 1 ]; then
      shim_lat "$s" libgpulmt_mpi.so >> "$out/lat_$r.csv"; own_lat "$s" >> "$out/lat_$r.csv"
    else
      own_lat "$s" >> "$out/lat_$r.csv"; shim_lat "$s" libgpulmt_mpi.so >> "$out/lat_$r.csv"
    fi
  done
  pack
done
for s in ${TRACE_SIZES:-65536 1048576}; do
  for who in shim own; do
    log "trace $who $s"
    raw=$(mktemp -d /tmp/gpulmt-trace.XXXXXX)
    if [ $who = shim ]; then
      # shellcheck disable=SC2086
      GPULMT_ANATOMY_OUT="$raw/net" timeout 120 $pn -np 2 -x GPULMT_ANATOMY_OUT \
        -x LD_PRELOAD="$PWD/$bin/libgpulmt_mpi_anatomy.so" /tmp/cuda_osu lat "$s" "$(iters "$s")" \
        > "$out/trace_lat_${who}_$s.csv" 2>> "$out/log.txt"
    else
      GPULMT_ANATOMY_OUT="$raw/net" timeout 120 $pn -np 2 -x GPULMT_ANATOMY_OUT "$bin/osu_latency_anatomy_mpi" \
        -m "$s:$s" -i "$(iters "$s")" D D > "$out/trace_lat_${who}_$s.csv" 2>> "$out/log.txt"
    fi
    python3 lab/gpu/anatomy_trace.py "$raw/net" > "$out/trace_${who}_$s.csv" 2>> "$out/log.txt" || log "FAILED: trace $who $s"
    rm -rf "$raw"
  done
  pack
done
stop_mps
log done
pack
