#!/usr/bin/env bash
# Host-buffer 8 B latency on the 2-GPU host: plain Open MPI, plain Open MPI holding the
# communicator the PMPI shim holds (MPI_PINGPONG_COMMS=1), and under the shim; five
# alternating runs each, so medians and pairwise ratios can be read. Also what the
# MPI library runs on (ompi_info's pml and btl components).
# Usage: bash bench/gpu/hostlat_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2"
shim="-x LD_PRELOAD=$PWD/.gpu/bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda"
cat .gpu/commit > "$out/commit.txt"
ompi_info | grep -E "MCA (pml|btl|coll)" > "$out/ompi_info.txt" 2>&1
mpicc -O2 bench/anchors/mpi_pingpong.c -o /tmp/mpi_pingpong
csv="$out/hostlat.csv"
echo "variant,rep,bytes,half_rtt_us" > "$csv"
for rep in $(seq "${HOSTLAT_REPS:-5}"); do
  $mpirun /tmp/mpi_pingpong 8 200000 | awk -F, -v r=$rep '$3==8{print "plain," r ",8," $4}' >> "$csv"
  $mpirun -x MPI_PINGPONG_COMMS=1 /tmp/mpi_pingpong 8 200000 | awk -F, -v r=$rep '$3==8{print "plain_1comm," r ",8," $4}' >> "$csv"
  $mpirun $shim /tmp/mpi_pingpong 8 200000 | awk -F, -v r=$rep '$3==8{print "shim," r ",8," $4}' >> "$csv"
done
cat "$csv"
