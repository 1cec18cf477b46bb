#!/usr/bin/env bash
# gpulmt's GPU harness: the reference measurements and checks of one host in one call, so
# that every number is reported as a ratio to a ceiling measured beside it.
#
# Usage (repository root, binaries built by bench/gpu/prepare.sh and carried in .gpu/):
#   bash bench/gpu/run.sh full|osu|stencil|shim|checks|device|gio|coll|internode|ga|spts OUTDIR
# Modes:
#   osu      the host's ceilings (../shared/device anchors: raw copy engine, NCCL, host-staged
#            MPI; Open MPI shared memory; copy_pingpong, the floor of a copy-engine
#            ping-pong) and osu_latency / osu_bw / osu_bibw per protocol, the handle cache
#            on and off, split copies, the SHM fallback per chunk size, and the 8 B D D
#            latency five more times, each beside the floor
#   stencil  Stencil2D: bit-identical checks, then staged / inter-k / inter-k-overlap / gio
#            on 2 and 4 ranks, both precisions, halo 1 and 4, and compute alone (1 rank)
#   shim     the PMPI shim under mpirun on an application's cudaMalloc buffers: p2p.c's
#            semantic checks (2 and 4 ranks, on one node and across 2 pseudo-nodes), cuda_osu (bandwidth, latency, byte checks),
#            host latency with and without the shim, gpulmt's own osu_bw beside it
#   checks   correctness: every protocol x placement x size byte for byte, ranks sharing a
#            GPU, all-to-all, two-phase free, the handle cache, truncation, the C ABI,
#            peer death, and the CUDA backend's GPU unit tests
#   device   GPU-initiated communication (include/gpulmt_device.cuh): across 2 pseudo-nodes
#            (device_check --offnode under mpirun: checks, put+quiet, push to pop, Open MPI
#            H-H beside; device_offnode.csv), then device_check's
#            conformance checks on 2 and 4 ranks (name,ok|FAIL lines into check.csv), then
#            its put_signal ping-pong and one-block put bandwidth (device_bench.csv), and
#            NVSHMEM 3.8's same two benchmarks beside them when .gpu/peers.tar.xz is carried
#            (../shared/device/peers/prepare.sh .gpu; nvshmem.csv)
#   gio      Stencil2D's GIO mode beside staged / inter-k / inter-k-overlap (issue 28), 2048^2
#            and 4096^2 per rank (GIO_SIZES), halo 1, single precision (GIO_PRECISIONS="single
#            double" adds double, about 2 minutes more): across 2 pseudo-nodes (2 ranks,
#            every halo through the GIO queues and the proxies; 4 ranks, 2 per node, half the
#            halos direct), and 4 ranks of one node; each mode first checked bit-identical
#            across the pseudo-nodes (check.csv), then the table (stencil_gio_nodes2.csv,
#            stencil_gio_nodes1.csv, stencil_gio_summary.txt); then device_check --bench on
#            4 ranks (device_bench_np4.csv).
#            About 4 minutes on one H200. Not part of full.
#   coll     the shim's collectives (issue 30) under MPS with 2 and 4 ranks: its C tests on
#            CUDA memory (coll_tests.csv), then osu_coll (ffi/shim/examples) per collective
#            (Allreduce, Bcast, Allgather, Alltoall; 8 B to 64 MiB, each size checked) on
#            device buffers through the shim, on device buffers staged by hand around plain
#            Open MPI, and on host buffers (coll.csv), and NCCL's collectives where NCCL can
#            run (nccl_coll.csv: one rank per GPU); the table in coll_summary.txt.
#            COLL_PARTS="tests" or "bench" runs one half (each fits a 10-minute call);
#            narrower bench runs: COLL_NAMES (collectives), COLL_NPS (rank counts),
#            COLL_SIZES (MIN:MAX), COLL_BASE (the baselines: "staged host", "" for none),
#            COLL_ARGS (more osu_coll arguments, e.g. "-i 100"), COLL_ENV (more -x
#            settings for the runs through the shim)
#   internode the internode path (docs/internode.md) on one GPU, 2 pseudo-nodes under mpirun
#            (GPULMT_PSEUDO_NODES=2) with MPS: gpulmt-mpi-nodes' byte checks with 1 and 2 ranks
#            per node, 4-slot queues over TCP, a rank killed mid-transfer, the soak of many
#            messages in flight (3 nodes, and 2 of 2 ranks), sends ending out of order (check.csv);
#            osu_latency / osu_bw / osu_bibw D D and H H across the nodes over Open MPI's
#            shared memory (vader) and TCP, beside Open MPI H H, the host-staged anchor
#            (staged_mpi.sh) and a hand-written staging pipeline's D D bandwidth at 4 MiB
#            (bench/gpu/staging_ceiling.cu) on the same transport; the anatomy of one 8 B D D leg
#            (anatomy_net.csv); the ratios in internode_summary.txt. Not part of full.
#            8-9 minutes on one H200 (internode5 was still in the TCP anchors after 8):
#            give the call 600 s. INTERNODE_PARTS=checks runs the checks only (about a minute).
#   ga       global arrays (ga/, issue 29): gpulmt-ga-check's scenarios (random sections
#            against a serial reference, order, exact accumulate totals, non-blocking under
#            fence, bad input, short messages) on 2, 3 and 4 ranks and the C example
#            (name,ok|FAIL lines into check.csv), the CUDA 2-D copy's unit test, the
#            scenarios across 2 pseudo-nodes under mpirun, then ga_bench on 2 and 4 ranks
#            (ga_bench.csv: put/get bandwidth against section shape, short-message latency,
#            SpMV, each beside the raw heap transfer of the same bytes). Not part of full.
#   spts     SpTS (issue 28, docs/spts.md): the sparse triangular solve, gio (sync-free
#            persistent kernels) and inter-k (a kernel per level); first both modes checked
#            bit-identical to the serial CPU reference, contiguous and block-cyclic rows, on
#            1, 2 and 4 ranks of one node (gpulmt-run) and 2 and 4 ranks across 2
#            pseudo-nodes (mpirun; gio also with --unbatched, a put per value instead of
#            streams) (check.csv, spts_check.csv), then the table gio against
#            inter-k for SPTS_SIZES rows (default "50000 200000"), SPTS_ITERS timed solves
#            (default 3), on 2 and 4 ranks of one node and across the pseudo-nodes
#            (spts_nodes1.csv, spts_nodes2.csv: mode,ranks,n,nnz,levels,time_ms;
#            spts_summary.txt; gio-unbatched only with SPTS_UNBATCHED=1). About 2 minutes on one
#            H200. Not part of full.
#   full     all five, then bench-report and OUTDIR.tgz (about 9 minutes on 2x H200)
# Every mode but checks ends with bench-report (OUTDIR/report.md, summary.csv, plots).
#
# One GPU or two: with one, the ranks share it, and MPS is started first (without it the
# driver time-slices the ranks' contexts); with two, MPS runs for Stencil2D's 4 ranks only.
# GPULMT_DEVICE=sim runs what needs no GPU on simulated devices and says what it skips (the
# anchors and the shim's CUDA programs need nvcc). Settings: BIN (binaries, default
# .gpu/bin), MAX (largest message, default 1G), CHECK_SIZES (the checks' ping-pong sizes),
# STENCIL_SIZES (default "2048 4096 8192"), STENCIL_ITERS (default 200), INTERNODE_OSU_ARGS
# (extra options of the internode mode's osu runs, e.g. "-i 20 -x 2" for a quick sim run).
set -uo pipefail
mode=${1:?usage: bash bench/gpu/run.sh full|osu|stencil|shim|checks|device|gio|coll|internode|ga|spts OUTDIR}
case $mode in full | osu | stencil | shim | checks | device | gio | coll | internode | ga | spts) ;; *)
  echo "bench/gpu/run.sh: unknown mode '$mode': full, osu, stencil, shim, checks, device, gio, coll, internode, ga or spts" >&2
  exit 2
  ;;
esac
source "$(dirname "$0")/preamble.sh" "${2:?usage: bash bench/gpu/run.sh $mode OUTDIR}"
run="$bin/gpulmt-run -n 2 --timeout 240 --"
mpirun="mpirun --allow-run-as-root --oversubscribe --bind-to none"
tools=.gpu/tools
skip() { log "skipped: $*"; echo "$*" >> "$out/skipped.txt"; }

# Bytes of a size like 64K or 1G.
bytes() {
  local n=${1%[KMG]}
  case $1 in *K) echo $((n << 10)) ;; *M) echo $((n << 20)) ;; *G) echo $((n << 30)) ;; *) echo "$n" ;; esac
}
max=$(bytes "${MAX:-1G}")
# The smaller of a size and MAX, in bytes.
upto() { local b; b=$(bytes "$1"); echo $((b < max ? b : max)); }

host_info() {
  if on_gpu; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$out/host.txt" 2>&1
    nvidia-smi topo -m >> "$out/host.txt" 2>&1
  else
    echo "sim devices (GPULMT_DEVICE=sim), $(nproc) CPUs" > "$out/host.txt"
  fi
}

ceilings() {
  if ! on_gpu; then
    skip "anchors and staged_mpi: they measure GPUs (sim here)"
  elif ! have_nvcc; then
    skip "anchors and staged_mpi: nvcc not found (they are CUDA programs built here)"
  elif [ ! -d "$tools" ]; then
    skip "anchors and staged_mpi: $tools missing (bench/gpu/prepare.sh copies ../shared/device there)"
  else
    log anchors
    bash $tools/anchors.sh "$max" > "$out/anchors.csv" 2> "$out/anchors.err"
    log staged_mpi
    bash $tools/staged_mpi.sh "$(upto 64M)" > "$out/staged_mpi.csv" 2> "$out/staged_mpi.err"
  fi
  if command -v mpicc >/dev/null 2>&1; then
    log mpi_sm
    mpicc -O2 bench/anchors/mpi_pingpong.c -o /tmp/mpi_pingpong \
      && $mpirun -np 2 /tmp/mpi_pingpong 8192 100000 > "$out/mpi_sm.csv" 2>&1
  else
    skip "mpi_sm: mpicc not found (Open MPI's shared-memory latency, the H H anchor)"
  fi
  if [ -x "$bin/copy_pingpong" ]; then
    log copy_pingpong
    $bin/copy_pingpong -m 1:64K -i 20000 > "$out/copy_pingpong.csv" 2>> "$out/log.txt"
  else
    skip "copy_pingpong: $bin/copy_pingpong missing (the lab's floor; prepare.sh builds it)"
  fi
}

osu() {
  ceilings
  local csv="$out/gpulmt.csv" p w c
  rm -f "$csv"
  log latency
  $run $bin/osu_latency -m "0:$max" --csv "$csv" D D
  for p in get put coop; do $run $bin/osu_latency -m "1:$(upto 64M)" --csv "$csv" --protocol $p D D; done
  $run $bin/osu_latency -m 0:8K -i 100000 --csv "$csv" H H
  log bandwidth per protocol
  for p in auto get put coop; do $run $bin/osu_bw -m "64K:$max" --csv "$csv" --stats --protocol $p D D; done
  log bibw per protocol
  for p in auto get put coop; do $run $bin/osu_bibw -m "64K:$max" --csv "$csv" --protocol $p D D; done
  log handle cache: osu_bw 1 MiB with and without the cache, windows 64 and 1
  for w in 64 1; do
    for c in 1 0; do
      GPULMT_HANDLE_CACHE=$c $run $bin/osu_bw -m 1M:1M -W $w -i 200 --stats D D > /tmp/cache.txt 2>&1
      # Both ranks' counters: GET opens on the receiver, PUT and COOPERATE on the sender.
      echo "cache=$c window=$w $(grep -E '^1048576' /tmp/cache.txt | tr -s ' ') $(grep -E 'rank [01] ' /tmp/cache.txt | grep -o 'rank [01] .*cache hits.*open_ms=[0-9.]*' | tr '\n' ' ')"
    done
  done | tee "$out/cache.txt"
  log split copies over lanes
  GPULMT_COPY_SPLIT=16M GPULMT_LANES=4 $run $bin/osu_bw -m "1M:$max" --csv "$out/split.csv" --protocol get D D
  log shm fallback
  $run $bin/osu_bw -m "64K:$(upto 256M)" --large-budget 2G --csv "$csv" --protocol shm D D
  for c in 512K 2M 4M; do
    GPULMT_CHUNK_SIZE=$c $run $bin/osu_bw -m "$(upto 4M):$(upto 256M)" --large-budget 2G --csv "$out/shm_chunk_$c.csv" \
      --protocol shm D D
  done
  log 8 B latency, five more runs, each beside the floor
  for _ in 1 2 3 4 5; do
    [ -x "$bin/copy_pingpong" ] && $bin/copy_pingpong -m 8:8 -i 20000 2>> "$out/log.txt" | tail -n +2 >> "$out/floor8.csv"
    $bin/gpulmt-run -n 2 --timeout 60 -- $bin/osu_latency -m 8:8 -i 20000 --csv "$out/lat8.csv" D D > /dev/null 2>> "$out/log.txt"
  done
}

stencil() {
  local csv="$out/stencil.csv" iters=${STENCIL_ITERS:-200} sizes=${STENCIL_SIZES:-2048 4096 8192} n m p s h
  one() {
    n=$1
    shift
    $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/stencil2d "$@" > /tmp/stencil.txt 2>&1 \
      || { log "stencil2d FAILED: -n $n $*"; tail -3 /tmp/stencil.txt >&2; }
  }
  # The 4-rank jobs put two ranks on a GPU (all of them on one): MPS lets them run at once
  # (gio's persistent kernels wait for each other: without MPS they would be time-sliced).
  MPS=1 start_mps
  # gio keeps both fields in the symmetric heap: 8192^2 doubles need two ~540 MB fields.
  export GPULMT_SYM_HEAP=${GPULMT_SYM_HEAP:-2G}
  echo "mps=$mps" > "$out/stencil_env.txt"
  log stencil2d checks: bit-identical to the single-rank CPU reference
  for n in 2 4; do for m in staged inter-k inter-k-overlap gio; do for p in single double; do
    one "$n" --size 512 --iters 20 --halo 4 --mode "$m" --precision "$p" --check --csv "$out/stencil_check.csv"
  done; done; done
  log stencil2d table
  for n in 2 4; do for p in single double; do for s in $sizes; do for h in 1 4; do
    for m in staged inter-k inter-k-overlap gio; do
      one "$n" --size "$s" --halo "$h" --precision "$p" --mode "$m" --iters "$iters" --csv "$csv"
    done
  done; done; done; done
  # Compute alone (one rank, no neighbours) at 4096² (or the first size): what the
  # overlapped exchange is measured against.
  local alone=4096
  case " $sizes " in *" 4096 "*) ;; *) alone=${sizes%% *} ;; esac
  for p in single double; do for h in 1 4; do
    one 1 --size "$alone" --halo "$h" --precision "$p" --mode inter-k --iters "$iters" --csv "$csv"
  done; done
  [ "$(gpu_count)" -ge 2 ] && stop_mps
}

# One run of the application benchmark $1 ($bin/$1) on $3 ranks in $4 pseudo-nodes (1: one
# node, gpulmt-run; more: mpirun with GPULMT_PSEUDO_NODES, which the program's `mpi` build
# from prepare.sh joins through MPI), the rest its options. Its output goes to $tmp and is
# appended to $out/$2; a failed run is a FAIL row of check.csv. Sets n, nodes and rc.
app_run() {
  local prog=$1 file=$2
  n=$3 nodes=$4
  shift 4
  if [ "$nodes" = 1 ]; then
    $bin/gpulmt-run -n "$n" --timeout 120 -- $bin/$prog "$@" > "$tmp" 2>&1
  else
    timeout 120 $mpirun -np "$n" -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES="$nodes" -x GPULMT_SYM_HEAP \
      $bin/$prog "$@" > "$tmp" 2>&1
  fi
  rc=$?
  cat "$tmp" >> "$out/$file"
  if [ $rc -ne 0 ]; then
    log "$prog FAILED (rc=$rc): -n $n nodes=$nodes $*"
    echo "${file%.txt}_n${n}_nodes${nodes},FAIL,rc=$rc $*" >> "$out/check.csv"
    tail -3 "$tmp" >&2
    # A CUDA job killed by the timeout leaves the MPS server unusable for the next one
    # (spts1: cuDevicePrimaryCtxRetain failed with CUDA_ERROR_LAUNCH_FAILED after it).
    if [ $rc -eq 124 ] && [ "${mps:-0}" = 1 ]; then
      log "restarting MPS after the timeout"
      stop_mps
      MPS=1 start_mps
    fi
  fi
}

# Stencil2D's GIO mode across pseudo-nodes and on 4 ranks (see the mode's line at the top).
# stencil2d is the `mpi`-feature build (prepare.sh): under mpirun with GPULMT_PSEUDO_NODES=2
# its job spans two nodes, under gpulmt-run it is one node as before.
stencil_gio() {
  local iters=${STENCIL_ITERS:-200} sizes=${GIO_SIZES:-2048 4096} precisions=${GIO_PRECISIONS:-single} n m mh p s h nodes rc
  local tmp="$out/stencil_gio_last.txt"
  # One run: ranks, pseudo-nodes, stencil2d's options (app_run).
  gio_one() { app_run stencil2d stencil_gio.txt "$@"; }
  export GPULMT_SYM_HEAP=${GPULMT_SYM_HEAP:-1G}
  # Every rank shares the GPU: MPS, so that the persistent kernels run at once.
  MPS=1 start_mps
  echo "mps=$mps device=$GPULMT_DEVICE iters=$iters sizes=$sizes" > "$out/stencil_gio_env.txt"
  log stencil2d across 2 pseudo-nodes: bit-identical to the CPU reference, 2 and 4 ranks
  # gio with halo 1 and 4 (its acknowledgements), the others with halo 1.
  for n in 2 4; do for mh in gio:1 gio:4 staged:1 inter-k:1 inter-k-overlap:1; do
    m=${mh%:*} h=${mh#*:}
    gio_one "$n" 2 --size 512 --iters 20 --halo "$h" --mode "$m" --precision double --check \
      --csv "$out/stencil_gio_check.csv"
    grep -q '^check: PASS' "$tmp" && echo "stencil_gio_check_n${n}_nodes2_${m}_h$h,ok" >> "$out/check.csv" \
      || echo "stencil_gio_check_n${n}_nodes2_${m}_h$h,FAIL,$(grep '^check:' "$tmp" | head -1)" >> "$out/check.csv"
  done; done
  log stencil2d table: gio against staged, inter-k and inter-k-overlap, per-rank sizes $sizes
  # stencil_gio_nodes2.csv: across the pseudo-nodes (2 and 4 ranks); stencil_gio_nodes1.csv:
  # 4 ranks of one node. summary lines: stencil_gio_summary.txt.
  for n_nodes in "2 2" "4 2" "4 1"; do
    set -- $n_nodes
    for p in $precisions; do for s in $sizes; do for m in gio inter-k inter-k-overlap staged; do
      gio_one "$1" "$2" --size "$s" --halo 1 --precision "$p" --mode "$m" --iters "$iters" \
        --csv "$out/stencil_gio_nodes$2.csv"
      grep '^summary:' "$tmp" | head -1 | sed "s|^|n=$1 nodes=$2 $p $s $m |" | tee -a "$out/stencil_gio_summary.txt"
    done; done; done
  done
}

gio() {
  stencil_gio
  if ! on_gpu; then
    skip "device_check --bench: the device API's kernels run on GPUs (sim here)"
    return
  fi
  log device API benchmarks on 4 ranks: put_signal ping-pong and one block\'s put bandwidth between PEs 0 and 1
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 $bin/gpulmt-run -n 4 --timeout 200 -- $bin/device_check --bench --max 16M \
    --csv "$out/device_bench_np4.csv" > "$out/device_bench_np4.txt" 2>&1 \
    || log "device_check --bench -n 4 FAILED: $(tail -1 "$out/device_bench_np4.txt")"
  cat "$out/device_bench_np4.csv" 2>/dev/null
}

shim() {
  local cuda=${CUDA_HOME:-/usr/local/cuda} np i
  if ! on_gpu; then
    skip "shim: its programs use cudaMalloc buffers (sim here; the shim's sim tests run in .ci/run)"
    return
  elif ! have_nvcc || ! command -v mpicc >/dev/null 2>&1; then
    skip "shim: needs the CUDA toolkit and mpicc to build its programs"
    return
  fi
  local shim="-x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda"
  mpicc -O2 -DP2P_CUDA_MALLOC -I$cuda/include -Iffi/shim/include ffi/shim/tests/c/p2p.c -L$cuda/lib64 -lcudart \
    -Wl,-rpath,$cuda/lib64 -o /tmp/p2p_cuda
  build_cuda_osu
  mpicc -O2 bench/anchors/mpi_pingpong.c -o /tmp/mpi_pingpong
  log shim: p2p semantics on cudaMalloc buffers
  for np in 2 4; do
    timeout 180 $mpirun -np $np $shim /tmp/p2p_cuda > "$out/shim_p2p_np$np.txt" 2>&1
    echo "p2p_cuda_malloc,np=$np,rc=$?,$(grep -c ' ok checks' "$out/shim_p2p_np$np.txt") ranks ok" | tee -a "$out/shim_log.txt"
  done
  timeout 180 $mpirun -np 4 $shim -x GPULMT_HANDLE_CACHE=0 /tmp/p2p_cuda > "$out/shim_p2p_np4_nocache.txt" 2>&1
  echo "p2p_cuda_malloc,np=4 handle cache off,rc=$?" | tee -a "$out/shim_log.txt"
  grep FAIL "$out/shim_p2p_np4_nocache.txt" | tee -a "$out/shim_log.txt"
  log shim: p2p across 2 pseudo-nodes, large device messages through the GIO queues
  for np in 2 4; do
    timeout 180 $mpirun -np $np $shim -x GPULMT_PSEUDO_NODES=2 /tmp/p2p_cuda > "$out/shim_p2p_nodes_np$np.txt" 2>&1
    echo "p2p_cuda_malloc,np=$np 2 pseudo-nodes,rc=$?,$(grep -c ' ok checks' "$out/shim_p2p_nodes_np$np.txt") ranks ok" \
      | tee -a "$out/shim_log.txt"
    grep ' counters ' "$out/shim_p2p_nodes_np$np.txt" | tee -a "$out/shim_log.txt"
  done
  log shim: every collective and the barrier on gpulmt_mpi_alloc buffers \(CUDA memory here\)
  mpicc -O2 -Iffi/shim/include ffi/shim/tests/c/coll.c -o /tmp/shim_coll
  mpicc -O2 -Iffi/shim/include ffi/shim/tests/c/barrier.c -o /tmp/shim_barrier
  for np in 2 4; do
    for prog in coll barrier; do
      # coll.c checks the staged path (the device path would take its large calls).
      timeout 180 $mpirun -np $np $shim -x GPULMT_MPI_COLL_DEVICE_MIN=off /tmp/shim_$prog > "$out/shim_${prog}_np$np.txt" 2>&1
      echo "shim_$prog,np=$np,rc=$?,$(grep -c ' ok' "$out/shim_${prog}_np$np.txt") ok lines" | tee -a "$out/shim_log.txt"
    done
  done
  log shim: cuda_osu, and host latency with and without the shim
  timeout 240 $mpirun -np 2 $shim /tmp/cuda_osu > "$out/shim_cuda_osu.csv" 2> "$out/shim_cuda_osu.err"
  echo "cuda_osu,rc=$?" | tee -a "$out/shim_log.txt"
  for i in 1 2 3; do
    timeout 60 $mpirun -np 2 /tmp/cuda_osu host >> "$out/host_latency.csv" 2>&1
    timeout 60 $mpirun -np 2 $shim /tmp/cuda_osu host | sed 's/^cuda_osu/cuda_osu_shim/' >> "$out/host_latency.csv" 2>&1
  done
  log shim: gpulmt\'s own osu_bw in the same call
  $bin/gpulmt-run -n 2 --timeout 120 -- $bin/osu_bw -m "1M:$(upto 256M)" --csv "$out/gpulmt_bw.csv" D D > /dev/null 2>&1
}

# The shim's collectives (see the usage above). On sim (a dry run) device memory exists
# only through the shim (gpulmt_mpi_alloc), so every osu_coll run preloads it; on GPUs the
# staged and host runs are plain Open MPI, osu_coll's device buffers cudaMalloc's.
coll() {
  local cuda=${CUDA_HOME:-/usr/local/cuda} np c m prog rc osu=/tmp/osu_coll parts=${COLL_PARTS:-tests bench}
  if ! command -v mpicc >/dev/null 2>&1; then
    skip "coll: needs mpicc to build the shim's C programs"
    return
  fi
  local shim="-x LD_PRELOAD=$PWD/$bin/libgpulmt_mpi.so -x GPULMT_DEVICE=$GPULMT_DEVICE -x GPULMT_MPI_STAGING_MAX=1G"
  local plain=""
  if on_gpu; then
    if ! have_nvcc; then
      skip "coll: needs the CUDA toolkit (osu_coll's cudaMalloc build, the NCCL anchor)"
      return
    fi
    # NVRTC for the device reduction of MPI_Allreduce, which the shim loads at run time.
    shim="$shim -x LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$cuda/lib64"
    mpicc -O2 -DOSU_COLL_CUDA -I$cuda/include -Iffi/shim/include ffi/shim/examples/osu_coll.c -L$cuda/lib64 -lcudart \
      -Wl,-rpath,$cuda/lib64 -o $osu
  else
    mpicc -O2 -Iffi/shim/include ffi/shim/examples/osu_coll.c -o $osu
    plain=$shim
  fi
  echo "mps=$mps gpus=$(gpu_count) device=$GPULMT_DEVICE" > "$out/coll_env.txt"
  if [[ " $parts " == *" tests "* ]]; then
    log coll: the shim\'s C tests on gpulmt_mpi_alloc buffers \(CUDA memory on GPUs\), 2 and 4 ranks
    local dir
    dir=$(mktemp -d /tmp/gpulmt-coll-io.XXXXXX)
    for prog in coll devcoll io calls rma p2p blocked barrier; do
      mpicc -O2 -Iffi/shim/include ffi/shim/tests/c/$prog.c -o /tmp/shim_$prog
    done
    for np in 2 4; do
      for prog in coll devcoll io calls rma p2p blocked barrier; do
        local env="" args=""
        case $prog in
          coll) env="-x GPULMT_MPI_COLL_DEVICE_MIN=off" ;;
          devcoll) env="-x GPULMT_MPI_COLL_DEVICE_MIN=64K" ;;
          io) args=$dir ;;
        esac
        timeout 240 $mpirun -np $np $shim $env /tmp/shim_$prog $args > "$out/coll_test_${prog}_np$np.txt" 2>&1
        rc=$?
        # 77: the MPI library lacks what the test needs (rma.c: windows of host memory).
        [ $rc = 77 ] && skip "$prog np=$np: $(grep -m1 '^skip:' "$out/coll_test_${prog}_np$np.txt")"
        echo "$prog,np=$np,rc=$rc,$(grep -c ' ok checks' "$out/coll_test_${prog}_np$np.txt") of $np ranks ok" \
          | tee -a "$out/coll_tests.csv"
      done
    done
    rm -rf "$dir"
  fi
  if [[ " $parts " == *" bench "* ]]; then
    log coll: osu_coll, device through the shim / staged by hand / host, 2 and 4 ranks
    local sizes=${COLL_SIZES:-8:$(upto 64M)}
    # shellcheck disable=SC2086 # COLL_ARGS and COLL_ENV are lists of words
    for np in ${COLL_NPS:-2 4}; do
      for c in ${COLL_NAMES:-allreduce bcast allgather alltoall}; do
        timeout 300 $mpirun -np $np $shim ${COLL_ENV:-} $osu $c device -m "$sizes" ${COLL_ARGS:-} -c --csv "$out/coll.csv" \
          > "$out/osu_coll_${c}_device_np$np.txt" 2>&1 || log "osu_coll $c device np=$np FAILED (rc=$?)"
        for m in ${COLL_BASE-staged host}; do
          timeout 300 $mpirun -np $np $plain $osu $c $m -m "$sizes" ${COLL_ARGS:-} -c --csv "$out/coll.csv" \
            > "$out/osu_coll_${c}_${m}_np$np.txt" 2>&1 || log "osu_coll $c $m np=$np FAILED (rc=$?)"
        done
      done
    done
    if on_gpu; then
      local nccl
      nccl=$(python3 -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
      if [ -n "$nccl" ] && nvcc -O2 -std=c++17 -arch=sm_90 -I"$nccl/include" bench/anchors/nccl_coll.cu -o /tmp/nccl_coll \
        -L"$nccl/lib" -l:libnccl.so.2 -Xlinker -rpath="$nccl/lib" 2>> "$out/log.txt"; then
        for np in 2 4; do
          /tmp/nccl_coll $np "$(upto 64M)" >> "$out/nccl_coll.csv" 2> "$out/nccl_coll_np$np.err" \
            || skip "nccl np=$np: $(tail -1 "$out/nccl_coll_np$np.err")"
        done
      else
        skip "nccl: NCCL (python3 -c 'import nvidia.nccl') not found or nccl_coll.cu did not build"
      fi
    else
      skip "nccl: NCCL's collectives run on GPUs (sim here)"
    fi
  fi
  python3 bench/gpu/coll_summary.py "$out" > "$out/coll_summary.txt"
  cat "$out/coll_summary.txt" >&2
}

checks() {
  local sizes=${CHECK_SIZES:-0,1,7,4095,4096,65537,1048576,4194304,67108864,1073741824} p pl
  check() {
    local name=$1
    shift
    if "$@" > /tmp/chk.txt 2>&1; then
      echo "$name,ok,$(grep -o 'protocols.*' /tmp/chk.txt | head -1 | tr ',' ' ')"
    else
      echo "$name,FAIL"
      tail -5 /tmp/chk.txt
    fi
  }
  for p in auto get put coop shm; do
    for pl in "D D" "D H" "H D" "H H"; do
      check "pingpong,$p,$pl" env GPULMT_PROTOCOL=$p $run $bin/gpulmt-check pingpong --placement "$pl" --sizes "$sizes" --offset 4096
    done
  done
  for p in get put coop shm; do
    check "same_gpu_pingpong,$p,D D" env GPULMT_GPU=0 GPULMT_PROTOCOL=$p $run $bin/gpulmt-check pingpong \
      --placement "D D" --sizes 1,65537,4194304,67108864 --offset 4096
  done
  check same_device_3ranks env GPULMT_GPU=0 $bin/gpulmt-run -n 3 --timeout 120 -- $bin/gpulmt-check same-device
  check alltoall_4ranks $bin/gpulmt-run -n 4 --timeout 120 -- $bin/gpulmt-check alltoall --iters 4
  check free_4ranks $bin/gpulmt-run -n 4 --timeout 120 -- $bin/gpulmt-check free --rounds 3 --fresh-open
  check cache_64_in_flight $run $bin/gpulmt-check cache
  for pl in "D D" "H D" "D H"; do check "truncate $pl" $run $bin/gpulmt-check truncate --placement "$pl"; done
  if [ -x "$bin/c_host" ]; then
    check c_abi_plugin_host_all_protocols $bin/c_host get put coop shm auto
    check c_abi_plugin_host_rings_all_protocols env GPULMT_HOST_RINGS=1 $bin/c_host get put coop shm auto
    check c_abi_endpoint_pingpong_device $run $bin/c_pingpong device 50 1 8 65536 4194304 67108864
  fi
  $bin/gpulmt-run -n 2 --timeout 60 -- $bin/gpulmt-check die --when mid --how kill --placement "D D" > /tmp/chk.txt 2>&1
  if grep -q survivor-ok /tmp/chk.txt; then echo "peer_death_mid_transfer,ok"; else
    echo "peer_death_mid_transfer,FAIL"
    tail -5 /tmp/chk.txt
  fi
  if on_gpu && [ -x "$bin/gpulmt-unit" ]; then
    if $bin/gpulmt-unit --ignored --test-threads=1 device::cuda > "$out/unit.txt" 2>&1; then
      echo "cuda_unit_tests,ok,$(grep -o '[0-9]* passed' "$out/unit.txt" | tail -1)"
    else
      echo "cuda_unit_tests,FAIL"
      tail -5 "$out/unit.txt"
    fi
  fi
}

# Across 2 pseudo-nodes of this host (GPULMT_PSEUDO_NODES=2, docs/internode.md): the
# device checks with PE 1 off-node (queue path), then put+quiet at 8 B from the GPU and
# from the host, a queue push's trip to the proxy (MSCCL++: 1.97 us push to pop on H200),
# and Open MPI's own host-to-host 8 B latency between the same ranks (the transport the
# proxies use). On sim only the host's rows run.
device_offnode() {
  log device API across 2 pseudo-nodes: checks, put+quiet, push to pop, beside Open MPI H-H
  GPULMT_PSEUDO_NODES=2 timeout 300 $mpirun -np 2 -x GPULMT_PSEUDO_NODES=2 $bin/device_check --offnode \
    --csv "$out/device_offnode.csv" > "$out/device_offnode.txt" 2>&1
  echo "device_check_offnode,rc=$?" >> "$out/log.txt"
  grep -E '^[a-z_]+,(ok|FAIL),' "$out/device_offnode.txt" | sed "s/^/device_offnode_/" | tee -a "$out/check.csv"
  grep -E '^(gpulmt|openmpi)_' "$out/device_offnode.txt" || log "device_check --offnode FAILED: $(tail -1 "$out/device_offnode.txt")"
}

device() {
  local n
  device_offnode
  if ! on_gpu; then
    skip "device: the device API's kernels run on GPUs (sim here; its host side runs in .ci/run)"
    return
  fi
  log device API checks on 2 and 4 ranks
  for n in 2 4; do
    $bin/gpulmt-run -n $n --timeout 300 -- $bin/device_check > "$out/device_check_np$n.txt" 2>&1
    echo "device_check,np=$n,rc=$?" >> "$out/log.txt"
    grep -E '^[a-z_]+,(ok|FAIL),' "$out/device_check_np$n.txt" | sed "s/^/device_np${n}_/" | tee -a "$out/check.csv"
    grep -qE '^[a-z_]+,ok,' "$out/device_check_np$n.txt" || {
      echo "device_np${n},FAIL,no check ran: $(tail -1 "$out/device_check_np$n.txt")" | tee -a "$out/check.csv"
    }
  done
  log device API benchmarks: put_signal ping-pong and one block\'s put bandwidth, beside NVSHMEM\'s
  # The anchor gives each of its two MPS clients half the GPU; so does this run.
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 $bin/gpulmt-run -n 2 --timeout 300 -- $bin/device_check --bench \
    --csv "$out/device_bench.csv" > "$out/device_bench.txt" 2>&1 || log "device_check --bench FAILED: $(tail -1 "$out/device_bench.txt")"
  if [ -f .gpu/peers.sh ] && [ -f .gpu/peers.tar.xz ]; then
    log nvshmem anchor
    bash .gpu/peers.sh .gpu > "$out/nvshmem.csv" 2> "$out/nvshmem.err"
  else
    skip "nvshmem anchor: .gpu/peers.tar.xz missing (bash ../shared/device/peers/prepare.sh .gpu packs it)"
  fi
  cat "$out/device_bench.csv" "$out/nvshmem.csv" 2>/dev/null | grep -v '^anchor,' | sort -t, -k2,2 -k3,3n -k1,1
}

# The internode path across 2 pseudo-nodes of this host (see the mode's line at the top).
# The binaries are the `mpi`-feature builds prepare.sh adds (*_mpi, gpulmt-mpi-nodes); a
# missing one fails the mode at once.
internode() {
  local b pn np rc transport mca what
  for b in gpulmt-mpi-nodes osu_latency_mpi osu_bw_mpi osu_bibw_mpi; do
    if [ ! -x "$bin/$b" ]; then
      log "internode FAILED: $bin/$b missing (bash bench/gpu/prepare.sh builds it)"
      echo "internode_binaries,FAIL,$bin/$b missing" >> "$out/check.csv"
      return 1
    fi
  done
  if ! command -v mpirun >/dev/null 2>&1; then
    log "internode FAILED: mpirun not found (the internode path runs under Open MPI)"
    echo "internode_mpirun,FAIL,mpirun missing" >> "$out/check.csv"
    return 1
  fi
  pn="$mpirun -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2"
  # A step that fails is a FAIL row of check.csv, so the mode's exit status says so.
  failed() {
    log "internode FAILED: $*"
    echo "internode,FAIL,$*" >> "$out/check.csv"
  }
  echo "mps=$mps device=$GPULMT_DEVICE" > "$out/internode_env.txt"
  ompi_info 2>/dev/null | grep -i 'cuda' >> "$out/internode_env.txt"

  log internode checks: gpulmt-mpi-nodes, byte for byte
  # name, ranks, mpirun options, program arguments
  while IFS='|' read -r what np mca args; do
    # shellcheck disable=SC2086 # options and arguments are words
    timeout 240 $pn -np "$np" $mca "$bin/gpulmt-mpi-nodes" $args < /dev/null > "$out/internode_$what.txt" 2>&1
    rc=$?
    if [ "$what" = killed_mid_transfer ]; then
      # The job must end with an error status, not hang (timeout's 124) nor succeed.
      if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'killing itself mid-transfer' "$out/internode_$what.txt"; then
        echo "internode_$what,ok,rc=$rc"
      else
        echo "internode_$what,FAIL,rc=$rc"
      fi
    elif [ $rc -eq 0 ] && [ "$(grep -c '^rank [0-9]* ok checks=' "$out/internode_$what.txt")" = "$np" ]; then
      echo "internode_$what,ok,$(grep -o 'checks=[0-9]*' "$out/internode_$what.txt" | head -1)"
    else
      echo "internode_$what,FAIL,rc=$rc $(grep -m1 FAIL "$out/internode_$what.txt")"
    fi | tee -a "$out/check.csv"
  done <<'CASES'
2_nodes_x1|2||
2_nodes_x2|4||
2_nodes_x2_tcp_4_slots|4|--mca btl tcp,self -x GPULMT_NET_QUEUE_SLOTS=4|--max 4M
killed_mid_transfer|4||die
soak_3_nodes_4_slots|3|-x GPULMT_PSEUDO_NODES=3 -x GPULMT_NET_QUEUE_SLOTS=4|soak --seed 1 --count 800 --window 30 --sizes 4097,8193,65537
soak_2_nodes_x2|4||soak --seed 2 --count 300 --window 30
soak_2_nodes_x2_cts|4|-x GPULMT_NET_PUSH_MAX=0 -x GPULMT_NET_QUEUE_SLOTS=4|soak --seed 3 --count 300 --window 30
order_3_nodes|3|-x GPULMT_PSEUDO_NODES=3|order
CASES
  if [ "${INTERNODE_PARTS:-all}" = checks ]; then
    log "internode: INTERNODE_PARTS=checks, the osu part skipped"
    return 0
  fi

  log internode osu: D D and H H across 2 pseudo-nodes, shared memory and TCP
  for transport in vader tcp; do
    mca=""
    [ $transport = tcp ] && mca="--mca btl tcp,self"
    local csv="$out/internode_$transport.csv"
    rm -f "$csv"
    for pl in "D D" "H H"; do
      # shellcheck disable=SC2086
      timeout 300 $pn -np 2 $mca $bin/osu_latency_mpi --large-budget 2G ${INTERNODE_OSU_ARGS:-} -m "0:$(upto 64M)" --csv "$csv" $pl > /dev/null 2>> "$out/log.txt" \
        || failed "osu_latency_mpi $transport $pl"
      # shellcheck disable=SC2086
      timeout 300 $pn -np 2 $mca $bin/osu_bw_mpi --large-budget 2G ${INTERNODE_OSU_ARGS:-} -m "1:$(upto 64M)" --csv "$csv" $pl > /dev/null 2>> "$out/log.txt" \
        || failed "osu_bw_mpi $transport $pl"
      # shellcheck disable=SC2086
      timeout 300 $pn -np 2 $mca $bin/osu_bibw_mpi --large-budget 2G ${INTERNODE_OSU_ARGS:-} -m "1:$(upto 64M)" --csv "$csv" $pl > /dev/null 2>> "$out/log.txt" \
        || failed "osu_bibw_mpi $transport $pl"
    done
    # Open MPI H H and the host-staged anchor on the same transport, in the same call.
    if ! on_gpu; then
      skip "internode anchors ($transport): staged_mpi.sh measures GPUs (sim here)"
    elif ! have_nvcc || [ ! -f $tools/staged_mpi.sh ]; then
      log "internode FAILED: the anchors need nvcc and $tools/staged_mpi.sh (prepare.sh copies ../shared/device)"
      echo "internode_anchors_$transport,FAIL,nvcc or $tools/staged_mpi.sh missing" >> "$out/check.csv"
    else
      MPIRUN_ARGS="$mca" bash $tools/staged_mpi.sh "$(upto 64M)" host > "$out/host_mpi_$transport.csv" 2>> "$out/log.txt" \
        || failed "staged_mpi.sh host ($transport)"
      MPIRUN_ARGS="$mca" bash $tools/staged_mpi.sh "$(upto 64M)" > "$out/staged_mpi_$transport.csv" 2>> "$out/log.txt" \
        || failed "staged_mpi.sh ($transport)"
      # The ceiling of any staging pipeline on this transport: a hand-written one without
      # gpulmt, osu_bw's window of 64, gpulmt's pieces (512 KiB), 16 bounce buffers a side.
      local ceiling="$out/staging_ceiling_$transport.csv"
      echo "mode,size,window,chunk,nbuf,threads,GBps" > "$ceiling"
      if [ -x /tmp/staging_ceiling ] || build_staging_ceiling; then
        # At 4 MiB only: the mode's call is near its 10 minutes (16 MiB over TCP takes 20 s).
        # shellcheck disable=SC2086
        timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none $mca -np 2 /tmp/staging_ceiling dd "$(upto 4M)" 64 524288 16 1 \
          < /dev/null >> "$ceiling" 2>> "$out/log.txt" || failed "staging_ceiling $transport"
      else
        failed "staging_ceiling.cu did not build (log.txt)"
      fi
    fi
  done

  log internode proxy profile: osu_bw D D and H H at 4-16 MiB, vader
  for pl in "D D" "H H"; do
    # shellcheck disable=SC2086
    GPULMT_LOG=warn,gpulmt_net_profile=info timeout 300 $pn -x GPULMT_LOG -np 2 $bin/osu_bw_mpi -m "$(upto 4M):$(upto 16M)" $pl \
      > /dev/null 2> "$out/profile_${pl// /}.txt" || failed "osu_bw_mpi with the proxy profile ($pl)"
  done

  log internode anatomy: one 8 B D D leg, post to completion
  if [ -x "$bin/osu_latency_anatomy_mpi" ]; then
    net_anatomy "$bin/osu_latency_anatomy_mpi" 8 5000 "$pn" "$out/anatomy_net.csv" \
      || failed "osu_latency_anatomy_mpi or anatomy_net.py (their errors are in log.txt)"
  else
    log "internode FAILED: $bin/osu_latency_anatomy_mpi missing (prepare.sh builds it)"
    echo "internode_anatomy,FAIL,osu_latency_anatomy_mpi missing" >> "$out/check.csv"
  fi
  python3 bench/gpu/internode_summary.py "$out" | tee "$out/internode_summary.txt"
}

ga() {
  local n sc
  log global arrays: checks on 2, 3 and 4 ranks
  for n in 2 3 4; do
    for sc in random order acc-total nb bad msg; do
      if $bin/gpulmt-run -n $n --timeout 300 -- $bin/gpulmt-ga-check $sc > /tmp/ga.txt 2>&1 \
        && [ "$(grep -c " ok $sc\$" /tmp/ga.txt)" = "$n" ]; then
        echo "ga_$sc,np=$n,ok,$(grep -o 'ga-[a-z]* .*' /tmp/ga.txt | head -1)"
      else
        echo "ga_$sc,np=$n,FAIL"
        tail -5 /tmp/ga.txt
      fi
    done
  done | tee -a "$out/check.csv"
  if [ -x "$bin/c_ga" ]; then
    if $bin/gpulmt-run -n 3 --timeout 120 -- $bin/c_ga > /tmp/ga.txt 2>&1; then
      echo "ga_c_example,np=3,ok" | tee -a "$out/check.csv"
    else
      echo "ga_c_example,np=3,FAIL" | tee -a "$out/check.csv"
      tail -5 /tmp/ga.txt
    fi
  fi
  # The backend's 2-D copy (cuMemcpy2DAsync, transport/src/device/cuda/copy_2d.rs) that
  # moves each strided block of a section in one call.
  if on_gpu && [ -x "$bin/gpulmt-unit" ]; then
    if $bin/gpulmt-unit --ignored --test-threads=1 device::cuda::tests::gpu_copies_2d > /tmp/ga.txt 2>&1 \
      && grep -q '1 passed' /tmp/ga.txt; then
      echo "ga_cuda_copy_2d,ok"
    else
      echo "ga_cuda_copy_2d,FAIL"
      tail -5 /tmp/ga.txt
    fi | tee -a "$out/check.csv"
  fi
  # Across 2 pseudo-nodes (mpirun, 2 x 2 ranks): the arrays' heaps reach each other
  # through the internode path's queues and proxy (ga/tests/internode.rs on sim).
  if [ -x "$bin/gpulmt-ga-check_mpi" ] && command -v mpirun > /dev/null 2>&1; then
    for sc in random acc-total order nb; do
      if timeout 300 $mpirun -np 4 -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2 $bin/gpulmt-ga-check_mpi --mpi $sc \
        < /dev/null > /tmp/ga.txt 2>&1 && [ "$(grep -c " ok $sc\$" /tmp/ga.txt)" = 4 ]; then
        echo "ga_offnode_$sc,np=4,ok,$(grep -o 'ga-[a-z]* .*' /tmp/ga.txt | head -1)"
      else
        echo "ga_offnode_$sc,np=4,FAIL"
        tail -5 /tmp/ga.txt
      fi
    done | tee -a "$out/check.csv"
  else
    skip "ga across pseudo-nodes: $bin/gpulmt-ga-check_mpi or mpirun missing (prepare.sh builds the former)"
  fi
  log global arrays: ga_bench on 2 and 4 ranks
  for n in 2 4; do
    $bin/gpulmt-run -n $n --timeout 500 -- $bin/ga_bench --max "$(upto 64M)" --csv "$out/ga_bench.csv" \
      > "$out/ga_bench_np$n.txt" 2>&1 || log "ga_bench -n $n FAILED: $(tail -1 "$out/ga_bench_np$n.txt")"
  done
}

# SpTS (see the mode's line at the top). spts is the `mpi`-feature build (prepare.sh): under
# mpirun with GPULMT_PSEUDO_NODES=2 its job spans two nodes, under gpulmt-run it is one.
spts() {
  local sizes=${SPTS_SIZES:-50000 200000} iters=${SPTS_ITERS:-3} n nodes m d s rc
  local tmp="$out/spts_last.txt"
  # One run: ranks, pseudo-nodes, spts's options (app_run).
  spts_one() { app_run spts spts.txt "$@"; }
  # The modes on $1 pseudo-nodes (across nodes gio also with a put per value, not streams),
  # and a mode's options.
  spts_modes() { if [ "$1" = 1 ]; then echo gio inter-k; else echo gio gio-unbatched inter-k; fi; }
  spts_mode() { case $1 in gio-unbatched) echo --mode gio --unbatched ;; *) echo --mode "$1" ;; esac; }
  export GPULMT_SYM_HEAP=${GPULMT_SYM_HEAP:-1G}
  # Every rank shares the GPU: MPS, so that the persistent kernels run at once.
  MPS=1 start_mps
  echo "mps=$mps device=$GPULMT_DEVICE iters=$iters sizes=$sizes" > "$out/spts_env.txt"
  log spts: bit-identical to the serial CPU reference, 1, 2, 4 ranks of one node, 2 and 4 across 2 pseudo-nodes
  for n_nodes in "1 1" "2 1" "4 1" "2 2" "4 2"; do
    set -- $n_nodes
    for m in $(spts_modes "$2"); do for d in contiguous 64; do
      if [ "$d" = contiguous ]; then set -- "$1" "$2"; else set -- "$1" "$2" --cyclic "$d"; fi
      spts_one "$@" --n 20000 --iters 2 $(spts_mode "$m") --check --csv "$out/spts_check.csv"
      grep -q '^check: PASS' "$tmp" && echo "spts_check_n${n}_nodes${nodes}_${m}_$d,ok" >> "$out/check.csv" \
        || echo "spts_check_n${n}_nodes${nodes}_${m}_$d,FAIL,$(grep '^check:' "$tmp" | head -1)" >> "$out/check.csv"
    done; done
  done
  # A put per value across nodes (gio-unbatched) is checked above but timed only with
  # SPTS_UNBATCHED=1: each value is a proxy round trip, seconds per solve at these sizes.
  log spts table: gio against inter-k, $sizes rows
  for n_nodes in "2 1" "4 1" "2 2" "4 2"; do
    set -- $n_nodes
    for s in $sizes; do for m in $(spts_modes "$2"); do
      [ "$m" = gio-unbatched ] && [ "${SPTS_UNBATCHED:-0}" != 1 ] && continue
      spts_one "$1" "$2" --n "$s" --iters "$iters" $(spts_mode "$m") --csv "$out/spts_nodes$2.csv"
      grep '^summary:' "$tmp" | head -1 | sed "s|^|nodes=$2 |" | tee -a "$out/spts_summary.txt"
    done; done
  done
}

report() {
  if [ -f "$out/gpulmt.csv" ] || [ -f "$out/stencil.csv" ]; then
    log report
    $bin/bench-report "$out" > "$out/report.md" 2>> "$out/log.txt"
  fi
}

host_info
# Ranks sharing the one GPU need MPS to run at once.
if on_gpu && [ "$(gpu_count)" -lt 2 ]; then MPS=1 start_mps; fi
case $mode in
  osu | stencil | shim | coll) "$mode" ;;
  device)
    device
    ;;
  gio)
    gio
    ;;
  internode)
    # One GPU or two: every rank of the pseudo-nodes shares it with another, so MPS.
    MPS=1 start_mps
    internode
    ;;
  ga)
    ga
    ;;
  spts)
    spts
    ;;
  checks)
    log checks
    checks | tee "$out/check.csv"
    ;;
  full)
    osu
    stencil
    shim
    log checks
    checks > "$out/check.csv"
    device
    ;;
esac
if [ -f "$out/check.csv" ]; then
  echo "checks: $(grep -c ',ok' "$out/check.csv") ok, $(grep -c ',FAIL' "$out/check.csv") failed" | tee -a "$out/log.txt"
fi
[ "$mode" = checks ] || [ "$mode" = device ] || [ "$mode" = gio ] || [ "$mode" = coll ] || [ "$mode" = internode ] || [ "$mode" = ga ] || [ "$mode" = spts ] || report
stop_mps
if [ "$mode" = full ]; then tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; fi
log done
! grep -q ',FAIL' "$out/check.csv" 2>/dev/null
