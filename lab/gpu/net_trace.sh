#!/usr/bin/env bash
# Where a D D leg across 2 pseudo-nodes goes at every protocol (eager, pushed rendezvous,
# staged pieces), on one GPU under MPS with the copy engine: every anatomy point of a leg
# in time order (lab/gpu/anatomy_trace.py) at SIZES (default "8 4096 65536 1048576"), for
# each build of ANATOMY_BINS (default osu_latency_anatomy_mpi; trace_<bin>_<bytes>.csv),
# beside osu_latency D D and H H (LAT_SIZES, default 8:4M) of LAT_BINS (default osu_latency_mpi;
# lat_<bin>_<round>_<pl>.csv, ROUNDS rounds in alternation, even ones in reverse order,
# default 1), the host-staged anchor and Open MPI's own H H (staged_mpi.csv, host_mpi.csv);
# the rounds side by side in summary.txt (lab/gpu/lat_table.py). All in OUTDIR.tgz. About
# 1.5 minutes for 3 builds of 3 rounds.
# Usage: bash lab/gpu/net_trace.sh OUTDIR   (binaries in .gpu/bin, anchors in .gpu/tools)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_trace.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_COPY_SERVER_MAX=0 ${EXTRA_X:-}"
MPS=1 start_mps
if have_nvcc; then
  timeout 90 bash .gpu/tools/staged_mpi.sh 4194304 host > "$out/host_mpi.csv" 2>> "$out/log.txt"
  timeout 90 bash .gpu/tools/staged_mpi.sh 4194304 > "$out/staged_mpi.csv" 2>> "$out/log.txt"
fi
pack
for r in $(seq "${ROUNDS:-1}"); do
  # Odd rounds in LAT_BINS's order, even rounds reversed (A B, B A, ...): a host whose
  # speed drifts during the call favours no build.
  bins=${LAT_BINS:-osu_latency_mpi}
  [ $((r % 2)) = 0 ] && bins=$(echo "$bins" | tr ' ' '\n' | tac | tr '\n' ' ')
  for b in $bins; do
    for pl in "D D" "H H"; do
      log "latency round $r $b $pl"
      timeout 120 $pn -np 2 "$bin/$b" -m "${LAT_SIZES:-8:4M}" --csv "$out/lat_${b}_${r}_${pl// /}.csv" $pl > /dev/null 2>> "$out/log.txt" \
        || log "FAILED: $b $pl"
    done
  done
  pack
done
for b in ${ANATOMY_BINS:-osu_latency_anatomy_mpi}; do
  for s in ${SIZES:-8 4096 65536 1048576}; do
    log "trace $b $s"
    raw=$(mktemp -d /tmp/gpulmt-trace.XXXXXX)
    iters=$(( s >= 1048576 ? 1000 : 4000 ))
    GPULMT_ANATOMY_OUT="$raw/net" timeout 120 $pn -np 2 -x GPULMT_ANATOMY_OUT "$bin/$b" -m "$s:$s" -i $iters D D \
      > /dev/null 2>> "$out/log.txt" && python3 lab/gpu/anatomy_trace.py "$raw/net" > "$out/trace_${b}_$s.csv" 2>> "$out/log.txt" \
      || log "FAILED: trace $b $s"
    rm -rf "$raw"
  done
  pack
done
stop_mps
python3 lab/gpu/lat_table.py "$out" > "$out/summary.txt" 2>> "$out/log.txt"
log done
pack
