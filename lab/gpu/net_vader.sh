#!/usr/bin/env bash
# Why the internode path over Open MPI's shared memory (vader) misses issue 27's targets at
# 1-64 KiB and in D D bandwidth, across 2 pseudo-nodes on one GPU under MPS:
# - vader's eager limit (4096 bytes with its header; larger messages take vader's own
#   rendezvous, whose ACK needs the receiving proxy's progress): osu_latency D D and H H,
#   8 B-64 KiB, and the anchors (host-staged and Open MPI's H H), each with the default
#   and with OMPI_MCA_btl_vader_eager_limit=16384 (lat_<eager>_<placement>.csv,
#   staged_<eager>.csv, host_<eager>.csv);
# - the anatomy of a 4 KiB D D leg beside an 8 B one (anatomy_<bytes>.csv);
# - which side's staging holds D D bandwidth back: osu_bw 4-64 MiB D H, H D and D D, with
#   the proxies' profiles (bw_<placement>.csv, profile_<placement>.txt).
# Everything so far is packed into OUTDIR.tgz after each step. About 3 minutes.
# Usage: bash lab/gpu/net_vader.sh OUTDIR   (binaries of bench/gpu/prepare.sh in .gpu/bin,
# osu_latency_anatomy_mpi among them; anchors in .gpu/tools)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_vader.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2"
{ lscpu | grep -E 'Model name|^CPU\(s\)|L3|L2'; ompi_info --param btl vader --level 9 2>/dev/null \
  | grep -E 'single_copy|eager_limit|max_send_size'; } > "$out/host.txt" 2>&1
MPS=1 start_mps
for e in default 16384; do
  if [ $e = default ]; then unset OMPI_MCA_btl_vader_eager_limit; else export OMPI_MCA_btl_vader_eager_limit=$e; fi
  if have_nvcc; then
    log "anchors, vader eager limit $e"
    timeout 60 bash .gpu/tools/staged_mpi.sh 65536 host > "$out/host_$e.csv" 2>> "$out/log.txt"
    timeout 60 bash .gpu/tools/staged_mpi.sh 65536 > "$out/staged_$e.csv" 2>> "$out/log.txt"
  fi
  for pl in "D D" "H H"; do
    log "osu_latency $pl, vader eager limit $e"
    # shellcheck disable=SC2086 # the placement is two words
    timeout 60 $pn -np 2 "$bin/osu_latency_mpi" -i 2000 -m 8:64K --csv "$out/lat_${e}_${pl// /}.csv" $pl \
      > /dev/null 2>> "$out/log.txt" || log "FAILED: latency $e $pl"
  done
  pack
done
unset OMPI_MCA_btl_vader_eager_limit
for s in 8 4096; do
  log "anatomy, $s B D D"
  net_anatomy "$bin/osu_latency_anatomy_mpi" $s 5000 "$pn" "$out/anatomy_$s.csv" || log "FAILED: anatomy $s"
done
pack
for pl in "D H" "H D" "D D"; do
  log "osu_bw $pl"
  # shellcheck disable=SC2086
  GPULMT_LOG=warn,gpulmt_net_profile=info timeout 60 $pn -x GPULMT_LOG -np 2 "$bin/osu_bw_mpi" --large-budget 1G \
    -m 4M:64M --csv "$out/bw_${pl// /}.csv" $pl > /dev/null 2> "$out/profile_${pl// /}.txt" || log "FAILED: bw $pl"
  pack
done
stop_mps
log done
pack
