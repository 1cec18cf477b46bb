#!/usr/bin/env bash
# Where the internode path's small-message latency goes beyond MPI's own, across 2
# pseudo-nodes on one GPU: osu_latency 8 B H H and D D (copy server on) under variants of
# the proxy's settings, each with the proxies' profiles, beside Open MPI's own H H and the
# host-staged anchor.
# Usage: bash lab/gpu/net_latency.sh OUTDIR
#   VARIANTS (default "base nosleep pinned"): base = the defaults; nosleep =
#   GPULMT_NET_IDLE_SLEEP=0 (the idle proxy spins and yields, never sleeps); pinned = each
#   rank on a core of its own and its proxy on another (GPULMT_NET_PROXY_CPU).
#   AB_BINS="a b" (binaries in $bin) instead compares builds: ROUNDS (default 3) rounds of
#   each binary's 8 B H H and D D in alternation, defaults only (lat_ab_<bin>_<r>_<pl>.csv);
#   a name bin@VAR=VALUE runs bin with that setting.
#   ANATOMY_BINS="a b" (osu_latency builds with the `anatomy` feature, in $bin): then one
#   8 B D D leg's steps per build (anatomy_<bin>.csv, bench/gpu/anatomy_net.py).
#   SIZES (default 8:8): the osu -m range; the anchors run up to its top.
#   COPY_SERVER_MAX (default 64K): GPULMT_COPY_SERVER_MAX for every run (0: copy engine).
#   MPS runs where the ranks share a GPU (one GPU); with two, each rank has its own.
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: net_latency.sh OUTDIR}"
variants=${VARIANTS:-base nosleep pinned}
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
pn="$mpirun -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 -x GPULMT_COPY_SERVER_MAX -x GPULMT_LOG"
export GPULMT_LOG=warn,gpulmt_net_profile=info GPULMT_COPY_SERVER_MAX=${COPY_SERVER_MAX:-64K}
sizes=${SIZES:-8:8}
top=${sizes#*:}
case $top in *K) top=$((${top%K} << 10)) ;; *M) top=$((${top%M} << 20)) ;; esac
{ cat /sys/devices/system/clocksource/clocksource0/current_clocksource; cc -O2 lab/gpu/clock_cost.c -o /tmp/clock_cost \
  && /tmp/clock_cost; } > "$out/clock.txt" 2>&1
[ "$(gpu_count)" -lt 2 ] && MPS=1 start_mps
have_nvcc && timeout 120 bash .gpu/tools/staged_mpi.sh "$top" host > "$out/host_mpi.csv" 2>> "$out/log.txt"
have_nvcc && timeout 120 bash .gpu/tools/staged_mpi.sh "$top" > "$out/staged_mpi.csv" 2>> "$out/log.txt"
if [ -n "${AB_BINS:-}" ]; then
  variants=""
  for r in $(seq "${ROUNDS:-3}"); do
    for b in $AB_BINS; do
      for pl in "H H" "D D"; do
        log "A/B round $r, $b, $pl"
        # A name b@VAR=VALUE runs binary b with that setting.
        b_env=() bname=$b
        if [[ $b == *@* ]]; then b_env=(-x "${b#*@}"); bname=${b%@*}; fi
        timeout 120 $pn "${b_env[@]}" -np 2 "$bin/$bname" -m "$sizes" -i 20000 --csv "$out/lat_ab_${b}_${r}_${pl// /}.csv" $pl \
          > /dev/null 2> "$out/profile_ab_${b}_${r}_${pl// /}.txt"
      done
    done
  done
fi
for v in $variants; do
  for pl in "H H" "D D"; do
    log "variant $v, $pl"
    tag="${v}_${pl// /}"
    case $v in
      base) env=() ; wrap=() ;;
      nosleep) env=(-x GPULMT_NET_IDLE_SLEEP=0) ; wrap=() ;;
      pinned)
        env=()
        wrap=(bash -c 'r=$OMPI_COMM_WORLD_RANK; GPULMT_NET_PROXY_CPU=$((8 + r)) exec taskset -c $((2 + r)) "$@"' pin)
        ;;
    esac
    timeout 120 $pn "${env[@]}" -np 2 "${wrap[@]}" "$bin/osu_latency_mpi" -m 8:8 -i 20000 --csv "$out/lat_$tag.csv" $pl \
      > /dev/null 2> "$out/profile_$tag.txt"
  done
done
for b in ${ANATOMY_BINS:-}; do
  log "anatomy, $b"
  net_anatomy "$bin/$b" 8 5000 "$pn" "$out/anatomy_$b.csv" || log "FAILED: anatomy, $b"
done
stop_mps
log "done"
