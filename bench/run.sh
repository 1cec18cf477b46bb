#!/usr/bin/env bash
# gpulmt's main job: builds the benchmarks and runs the OSU-style latency, bandwidth
# and bi-directional bandwidth tests on two local ranks, device buffers on both
# sides (D D) and host buffers (H H). On real GPUs when a CUDA driver and a GPU are
# present, on simulated devices otherwise; the first lines say which.
# Usage: bash bench/run.sh [max message size, default 64M]
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-64M}
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi
cargo build --release --quiet -p gpulmt --bin gpulmt-run -p gpulmt-bench --bin osu_latency --bin osu_bw --bin osu_bibw
bin=target/release
if "$bin/gpulmt-run" -n 1 -- sh -c 'exit 0' && [ "${GPULMT_DEVICE:-auto}" != sim ] && ls /dev/nvidia0 >/dev/null 2>&1; then
  echo "# devices: CUDA (a GPU and a driver were found; GPULMT_DEVICE=sim forces simulation)"
else
  echo "# devices: simulated (no CUDA GPU here: sim backend, device memory in /dev/shm)"
  export GPULMT_DEVICE=sim
fi
run() { "$bin/gpulmt-run" -n 2 --timeout 600 -- "$@"; echo; }
run "$bin/osu_latency" -m "0:$max" -c D D
if [ "${GPULMT_DEVICE:-auto}" != sim ]; then
  echo "# osu_latency D D with the copy server on (GPULMT_COPY_SERVER_MAX=64K, off by default: docs/design.md)"
  GPULMT_COPY_SERVER_MAX=64K run "$bin/osu_latency" -m 0:64K -c D D
fi
run "$bin/osu_latency" -m 0:64K H H
run "$bin/osu_bw" -m "1:$max" -c --stats D D
run "$bin/osu_bibw" -m "1:$max" -c D D
