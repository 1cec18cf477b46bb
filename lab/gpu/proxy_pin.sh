#!/usr/bin/env bash
# GPULMT_NET_PROXY_CPU as a list: 4 ranks of one host in 2 pseudo-nodes, the list 8-11;
# each rank's proxy thread must say it is pinned to 8 + its index on the host, and its
# thread's affinity (read from /proc while the job runs) must be that CPU alone.
# Usage: bash lab/gpu/proxy_pin.sh OUTDIR   (OUTDIR/pin.txt)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: proxy_pin.sh OUTDIR}"
MPS=1 start_mps
mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 \
  -x GPULMT_NET_PROXY_CPU=8-11 -x GPULMT_LOG=info -np 4 "$bin/osu_latency_mpi" -m 8:8 --csv "$out/lat.csv" H H \
  > "$out/job.txt" 2>&1 &
job=$!
# While it runs: every gpulmt-proxy thread's allowed CPUs.
for _ in $(seq 50); do
  sleep 0.2
  for t in /proc/[0-9]*/task/[0-9]*; do
    if grep -q '^gpulmt-proxy' "$t/comm" 2>/dev/null; then
      echo "$(cat "$t/comm") $(grep Cpus_allowed_list "$t/status")"
    fi
  done
done | sort -u > "$out/affinity.txt"
wait $job
echo "rc=$?" >> "$out/job.txt"
stop_mps
{ grep -o 'proxy thread pinned.*\|cpu=[0-9]*.*pinned' "$out/job.txt"; cat "$out/affinity.txt"; } > "$out/pin.txt"
cat "$out/pin.txt"
