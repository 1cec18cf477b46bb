#!/usr/bin/env python3
"""The SHM path's ceiling on a host of any GPU count: pinned host <-> device copies of one GPU
(what ../shared/device/anchors.cu's `staging` rows measure, which need two GPUs), with CuPy.
Prints CSV `anchor,metric,bytes,value` rows `staging,d2h_GBps|h2d_GBps,BYTES,GB/s`, the best
of 3 runs of 10 back-to-back copies each.

Usage: python3 bench/gpu/pinned_staging.py [max_bytes]
"""

import sys

import cupy as cp


def best_gbps(dst, src, n, kind, stream):
    best = 0.0
    for _ in range(3):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(10):
            cp.cuda.runtime.memcpyAsync(dst, src, n, kind, stream.ptr)
        end.record(stream)
        end.synchronize()
        ms = cp.cuda.get_elapsed_time(start, end)
        best = max(best, n * 10 / (ms * 1e-3) / 1e9)
    return best


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
    print("anchor,metric,bytes,value")
    stream = cp.cuda.Stream(non_blocking=True)
    host = cp.cuda.alloc_pinned_memory(top)
    dev = cp.cuda.alloc(top)
    n = 1 << 20
    while n <= top:
        d2h = best_gbps(host.ptr, dev.ptr, n, cp.cuda.runtime.memcpyDeviceToHost, stream)
        h2d = best_gbps(dev.ptr, host.ptr, n, cp.cuda.runtime.memcpyHostToDevice, stream)
        print(f"staging,d2h_GBps,{n},{d2h:.2f}")
        print(f"staging,h2d_GBps,{n},{h2d:.2f}")
        n *= 4


if __name__ == "__main__":
    main()
