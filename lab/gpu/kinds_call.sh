#!/usr/bin/env bash
# One GPU call of issue 45's second round: the shim's crash on VMM memory of several chunks
# (stderr, and a backtrace where gdb exists), then bench/gpu/kinds.sh's benchmark; all
# packed as $OUT/all.tgz (a call brings back 8 files).
set -u
mkdir -p $OUT/r
[ -d .gpu/bin ] || tar xJf .gpu/bin.tar.xz -C .gpu
# The shim's crash: stderr of a short run, and a backtrace where gdb exists.
cuda=/usr/local/cuda
mpicc -O2 -I$cuda/include ffi/shim/examples/mem_kinds.c -L$cuda/lib64 -lcudart -lcuda -Wl,-rpath,$cuda/lib64 -o /tmp/mk2
M="mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x LD_PRELOAD=$PWD/.gpu/bin/libgpulmt_mpi.so -x GPULMT_DEVICE=cuda -x GPULMT_LOG=info"
timeout 120 $M /tmp/mk2 0 > $OUT/r/shim.out 2> $OUT/r/shim.err; echo "shim rc=$?"
tail -c 3000 $OUT/r/shim.err
if command -v gdb >/dev/null; then
  timeout 200 $M gdb -batch -ex run -ex bt -ex "info registers rip" --args /tmp/mk2 0 > $OUT/r/gdb.txt 2>&1
  grep -A30 "SIGSEGV" $OUT/r/gdb.txt | head -60
else echo no gdb; fi
KINDS_PARTS="bench" bash bench/gpu/kinds.sh $OUT/r/k > $OUT/r/bench.log 2>&1
tail -5 $OUT/r/bench.log
cat $OUT/r/k/kinds_summary.txt
tar czf $OUT/all.tgz -C $OUT r && rm -rf $OUT/r
