#!/usr/bin/env bash
# Session 6, first exploration: small device copies as kernels (GPULMT_SM_COPY_MAX, commit
# dc974af; reverted after this run: kernels were slower than the copy engines).
# (1) the kernel copies' GPU unit test (both engines, local and peer, odd sizes and offsets);
# (2) copy_probe at 8 B, 4 KiB and 64 KiB (gpulmt_kernel_copy_poll beside the copy engine's);
# (3) osu_latency D D 8 B .. 256 KiB alternating GPULMT_SM_COPY_MAX=0 and 256K, three runs
# each; (4) osu_bw D D 8 B .. 256 KiB, both settings; (5) kernel copies through the protocol
# (get/put/coop/auto, offsets 3, two GPUs and one), checked byte for byte; (6) Stencil2D's
# overlap check (stencil_overlap.sh, 2 x 400 steps) with the halos moved by kernels (64K)
# and by copy engines (0).
# Usage: bash bench/gpu/explore8_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
$bin/gpulmt-unit --ignored --test-threads=1 --nocapture device::cuda::tests::gpu_kernel_copies > "$out/unit.txt" 2>&1
echo "unit rc=$?" | tee -a "$out/log.txt"
for n in 8 4096 65536; do $bin/copy_probe $n > "$out/copy_probe_$n.csv" 2>> "$out/log.txt"; done
for rep in 1 2 3; do for sm in 0 256K; do
  GPULMT_SM_COPY_MAX=$sm $bin/gpulmt-run -n 2 --timeout 120 -- $bin/osu_latency -m 8:262144 -i 5000 --csv "$out/lat_sm$sm.csv" D D > /dev/null 2>> "$out/log.txt"
done; done
for sm in 0 256K; do
  GPULMT_SM_COPY_MAX=$sm $bin/gpulmt-run -n 2 --timeout 120 -- $bin/osu_bw -m 8:262144 --csv "$out/bw_sm$sm.csv" D D > /dev/null 2>> "$out/log.txt"
done
chk() {
  name=$1; shift
  if "$@" > /tmp/chk.txt 2>&1; then echo "$name,ok,$(grep -o 'kernel_copies=[0-9]*' /tmp/chk.txt | tr '\n' ' ')"; else echo "$name,FAIL"; tail -5 /tmp/chk.txt; fi
}
for p in get put coop auto; do
  chk "kernel_pingpong,$p" env GPULMT_SM_COPY_MAX=256K GPULMT_PROTOCOL=$p $bin/gpulmt-run -n 2 --timeout 120 -- \
    $bin/gpulmt-check pingpong --placement "D D" --sizes 0,1,7,8,16,4095,4096,65537,262144,1048576 --offset 3
  chk "kernel_same_gpu,$p" env GPULMT_GPU=0 GPULMT_SM_COPY_MAX=256K GPULMT_PROTOCOL=$p $bin/gpulmt-run -n 2 --timeout 120 -- \
    $bin/gpulmt-check pingpong --placement "D D" --sizes 1,7,4096,65537,262144 --offset 4096
done > "$out/check.txt"
for sm in 0 64K; do
  mkdir -p "$out/stencil_sm$sm"
  GPULMT_SM_COPY_MAX=$sm bash bench/gpu/stencil_overlap.sh "$out/stencil_sm$sm" 2 400
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== unit"; grep -E "test result|panicked" "$out/unit.txt"
echo "== copy_probe (median us)"
for n in 8 4096 65536; do
  echo "$n B: $(grep -E 'ipc_pull_(gpulmt_copy_async_poll|gpulmt_kernel_copy_poll|memcpy_streamsync|data|kernel_data)|^copy_probe,(push|local)_gpulmt_(copy_async|kernel_copy)' "$out/copy_probe_$n.csv" | cut -d, -f2,3 | tr '\n' ' ')"
done
echo "== osu_latency D D (us, three runs): bytes sm0 | sm256K"
for b in 8 64 1024 4096 16384 65536 262144; do
  echo "$b: $(grep ",$b,us" "$out/lat_sm0.csv" | cut -d, -f6 | tr '\n' ' ') | $(grep ",$b,us" "$out/lat_sm256K.csv" | cut -d, -f6 | tr '\n' ' ')"
done
echo "== osu_bw D D (MB/s): bytes sm0 | sm256K"
for b in 8 1024 4096 16384 65536 262144; do
  echo "$b: $(grep ",$b,MBps" "$out/bw_sm0.csv" | cut -d, -f6) | $(grep ",$b,MBps" "$out/bw_sm256K.csv" | cut -d, -f6)"
done
echo "== checks"; cat "$out/check.txt"
for sm in 0 64K; do echo "== stencil overlap, GPULMT_SM_COPY_MAX=$sm"; $bin/bench-report "$out/stencil_sm$sm" 2>&1 | grep -A7 "overlap against compute alone"; done
