#!/usr/bin/env bash
# The PMPI shim's 8 B D D latency with gpulmt's control packets on MPI messages (the
# library in .gpu/old, e702dab: blobs as PMPI_Isend on a node communicator) against on
# gpulmt's rings (the carried one), in ROUNDS rotated rounds of ffi/shim/examples/cuda_osu.c
# (its byte checks included), with and without the application default-stream wait
# (GPULMT_MPI_SETTLE) and with the copy server (64K); gpulmt's own osu_latency 8 B D D
# beside them (RTR off: GET, as under the shim). Then p2p.c's semantic checks on cudaMalloc
# buffers under the new library, np 2 and 4. VARIANTS picks some of `one`'s variants
# (new_settle_server: the default-stream wait with the copy server).
# Usage: [ROUNDS=4] [MPS=1] [VARIANTS=...] bash lab/gpu/shim_rings.sh OUTDIR   (after prepare.sh and
# copying the old library to .gpu/old/libgpulmt_mpi.so; carry .gpu)
source "$(dirname "$0")/lab.sh"
nvidia-smi > "$out/host.txt" 2>&1
start_mps
build_cuda_osu
CUDA=${CUDA_HOME:-/usr/local/cuda}
echo "variant,round,us" > "$out/shim_rings.csv"
old=${OLD_LIB:-$PWD/.gpu/old/libgpulmt_mpi.so}
shim() { # variant round lib assignments...
  echo "$1,$2,$(SHIM_LIB=$3 shim_latency "$1 round $2" "${@:4}")" >> "$out/shim_rings.csv"
}
native() { # variant round assignments...
  rm -f /tmp/native.csv
  env "${@:3}" $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv /tmp/native.csv D D > /dev/null 2>> "$out/log.txt"
  echo "$1,$2,$(tail -n 1 /tmp/native.csv | cut -d, -f6)" >> "$out/shim_rings.csv"
}
one() { # variant round
  case $1 in
    old_none) shim "$1" "$2" "$old" GPULMT_MPI_SETTLE=none ;;
    new_none) shim "$1" "$2" "" GPULMT_MPI_SETTLE=none ;;
    old_settle) shim "$1" "$2" "$old" X=1 ;;
    new_settle) shim "$1" "$2" "" X=1 ;;
    old_server) shim "$1" "$2" "$old" GPULMT_MPI_SETTLE=none GPULMT_COPY_SERVER_MAX=64K ;;
    new_server) shim "$1" "$2" "" GPULMT_MPI_SETTLE=none GPULMT_COPY_SERVER_MAX=64K ;;
    new_settle_server) shim "$1" "$2" "" GPULMT_COPY_SERVER_MAX=64K ;;
    native) native "$1" "$2" GPULMT_RTR_PUT_MAX=0 ;;
    native_server) native "$1" "$2" GPULMT_RTR_PUT_MAX=0 GPULMT_COPY_SERVER_MAX=64K ;;
  esac
}
rotated_rounds "${VARIANTS:-old_none new_none old_settle new_settle old_server new_server native native_server}" one 4
log p2p semantics on cudaMalloc buffers, new library
mpicc -O2 -DP2P_CUDA_MALLOC -I$CUDA/include -Iffi/shim/include ffi/shim/tests/c/p2p.c -L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64 -o /tmp/p2p_cuda
for np in 2 4; do
  timeout 180 mpirun --allow-run-as-root --oversubscribe --bind-to none -np $np -x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so \
    -x GPULMT_DEVICE=cuda /tmp/p2p_cuda > "$out/p2p_np$np.txt" 2>&1
  echo "p2p_cuda_malloc,np=$np,rc=$?,$(grep -c ' ok checks' "$out/p2p_np$np.txt") ranks ok" | tee -a "$out/log.txt"
done
stop_mps
log done
cat "$out/checks.txt" 2>/dev/null
variant_medians "$out/shim_rings.csv"
