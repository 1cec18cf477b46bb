#!/usr/bin/env bash
# The PMPI shim's cost on blocking host messages: instructions per MPI_Send + MPI_Recv
# pair of bench/anchors/mpi_pingpong.c with one rank sending to itself, under callgrind
# (exact counts: no peer to poll for, and this machine may lack hardware counters), for
# plain Open MPI, plain holding a communicator as the shim does (MPI_PINGPONG_COMMS=1)
# and under the shim on sim devices; then (shim_dd) D D through the shim: the buffer from
# gpulmt_mpi_alloc, copies that take no time (GPULMT_SIM_COPY=inline), no default-stream
# wait, so the count and the time are the shim's and gpulmt's host path alone (gpulmt's
# own path alone: hostpath_cost). Two iteration counts are subtracted, which cancels
# start-up and tear-down. Then the time of the same loop without callgrind (noisy on a
# small machine; the median of REPEATS runs), and of the 2-rank ping-pong.
# Usage: [CONFIGS="plain comms1 shim shim_dd"] bench/shim_hostlat.sh [SHIM_LIB] [REPEATS]
# (needs mpicc, mpirun, valgrind)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lib=${1:-$root/target/release/libgpulmt_mpi.so}
repeats=${2:-5}
lo=2000 hi=12000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 "$root/bench/anchors/mpi_pingpong.c" -o "$tmp/pp"
extra() {
    case $1 in
    comms1) echo "-x MPI_PINGPONG_COMMS=1" ;;
    shim) echo "-x LD_PRELOAD=$lib -x GPULMT_DEVICE=sim" ;;
    shim_dd) echo "-x LD_PRELOAD=$lib -x GPULMT_DEVICE=sim -x MPI_PINGPONG_DEVICE=1 -x GPULMT_SIM_COPY=inline -x GPULMT_MPI_SETTLE=none" ;;
    esac
}
mpi() { mpirun --allow-run-as-root --oversubscribe "$@"; }
# Instructions of one run of ITERS with one rank.
instructions() { # config iters
    # shellcheck disable=SC2046
    mpi -np 1 $(extra "$1") valgrind -q --tool=callgrind --callgrind-out-file="$tmp/cg" "$tmp/pp" 8 "$2" > /dev/null
    awk '/^summary:/ {print $2}' "$tmp/cg"
}
# Median half round trip (us) of the 8-byte row.
latency() { # config ranks
    for _ in $(seq "$repeats"); do
        # shellcheck disable=SC2046
        mpi -np "$2" $(extra "$1") "$tmp/pp" 8 200000 | awk -F, '$3 == 8 {print $4}'
    done | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
# Pairs per run: two sizes (1 and 8 bytes), each ITERS plus a tenth of warm-up.
pairs=$(( (hi - lo) * 2 * 11 / 10 ))
echo "config,instructions_per_send_recv,self_us_median,pingpong_us_median"
for c in ${CONFIGS:-plain comms1 shim shim_dd}; do
    a=$(instructions $c $lo)
    b=$(instructions $c $hi)
    printf "%s,%.1f,%s,%s\n" $c "$(echo "($b - $a) / $pairs" | bc -l)" "$(latency $c 1)" "$(latency $c 2)"
done
