set -u
export GPULMT_DEVICE=cuda
b=.gpu/bin
$b/gpulmt-unit --ignored --test-threads=1 device::cuda 2>&1 | grep -E "test result|panicked|FAILED" | tail -3
export CUDA_MPS_PIPE_DIRECTORY=/tmp/gpulmt-mps CUDA_MPS_LOG_DIRECTORY=/tmp/gpulmt-mpslog
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d
for v in off on off on; do
  e=X=1; [ $v = on ] && e=GPULMT_COPY_SERVER_MAX=64K
  env $e $b/gpulmt-run -n 2 --timeout 60 -- $b/stencil2d --size 2048 --halo 1 --mode inter-k --iters 500 --timeline 2>&1 | grep -E "timeline: rank 0|time_per_iter|exchange" | sed "s/^/$v: /" | head -4
  env $e $b/gpulmt-run -n 2 --timeout 60 -- $b/osu_latency -m 8:8 -i 5000 D D 2>&1 | tail -1 | sed "s/^/$v lat: /"
done
echo quit | nvidia-cuda-mps-control
