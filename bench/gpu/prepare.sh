#!/usr/bin/env bash
# Builds everything a GPU call runs, here (Debian, no GPU), and gathers it in .gpu/
# (ignored by git), which the device tool carries: release binaries, the transport's
# unit tests (for their GPU-only cases, as gpulmt-unit), the C ABI examples, the PMPI
# shim, and the host's anchor programs (../shared/device as .gpu/tools).
# Usage: bash bench/gpu/prepare.sh   then run with carry [".gpu"]
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info && { grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude; }
cargo build --release --workspace --bins --quiet
cargo build --release -p gpulmt-shim -p gpulmt-ffi --quiet
unit=$(cargo test --release -p gpulmt --lib --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep -v null | head -1)
rm -rf .gpu && mkdir -p .gpu/bin
for b in gpulmt-run gpulmt-check osu_latency osu_bw osu_bibw stencil2d copy_probe copy_pingpong hostpath_cost window_probe server_probe bench-report; do
  cp "target/release/$b" .gpu/bin/
done
cp target/release/libgpulmt_mpi.so .gpu/bin/
cp "$unit" .gpu/bin/gpulmt-unit
inc=ffi/../include
for ex in host pingpong; do
  cc -std=c11 -O2 -I"$inc" "ffi/examples/$ex.c" -Ltarget/release -lgpulmt -Wl,-rpath,'$ORIGIN' -o ".gpu/bin/c_$ex"
done
cp target/release/libgpulmt.so .gpu/bin/
strip .gpu/bin/* 2>/dev/null || true
cp -r ../shared/device .gpu/tools
git rev-parse --short HEAD > .gpu/commit
git diff --quiet HEAD || echo "dirty" >> .gpu/commit
du -sh .gpu
