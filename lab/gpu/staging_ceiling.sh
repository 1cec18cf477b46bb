#!/usr/bin/env bash
# The ceiling of a staging pipeline over Open MPI's shared memory (vader) on this host, by a
# hand-written pipeline without gpulmt (bench/gpu/staging_ceiling.cu), beside Open MPI's own
# H H: whether D D can reach 0.9 of H H with few bounce buffers, and whether two or four
# threads driving MPI at once move more than one (vader's copies run on the thread in MPI's
# progress). Open MPI's transport is mpirun's choice: MPIRUN_ARGS="--mca btl tcp,self" for TCP.
# Usage: bash lab/gpu/staging_ceiling.sh OUTDIR   (CONFIGS: lines "mode size window chunk nbuf threads")
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: staging_ceiling.sh OUTDIR}"
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none ${MPIRUN_ARGS:-}"
[ "$(gpu_count)" -lt 2 ] && MPS=1 start_mps
build_staging_ceiling || { log "no nvcc, or the build failed (log.txt)"; exit 1; }
M4=4194304; K512=524288
configs=${CONFIGS:-"hh $M4 64 $M4 1 1
hh $M4 64 $M4 1 2
hh $M4 64 $M4 1 4
dd $M4 64 $K512 4 1
dd $M4 64 $K512 8 1
dd $M4 64 $K512 16 1
dd $M4 64 $K512 92 1
dd $M4 64 262144 8 1
dd $M4 64 1048576 8 1
dd $M4 64 $K512 8 2
dd $M4 64 $K512 8 4
dd $M4 64 $K512 16 2
hh 16777216 64 16777216 1 1
dd 16777216 64 $K512 8 1
dd 16777216 64 $K512 8 2"}
echo "mode,size,window,chunk,nbuf,threads,GBps" > "$out/ceiling.csv"
for rep in 1 2; do
  # mpirun reads stdin: each run's comes from /dev/null, or it would eat the list.
  while read -r mode size window chunk nbuf threads; do
    [ -n "$mode" ] || continue
    log "rep $rep: $mode $size x $window, chunk $chunk, $nbuf buffers, $threads threads"
    timeout 90 $mpirun -np 2 /tmp/staging_ceiling "$mode" "$size" "$window" "$chunk" "$nbuf" "$threads" \
      < /dev/null >> "$out/ceiling.csv" 2>> "$out/log.txt" || log "failed: rc $?"
  done <<< "$configs"
done
stop_mps
