#!/usr/bin/env bash
# Builds everything a GPU call runs, here (Debian, no GPU), and gathers it in .gpu/
# (ignored by git), which the device tool carries: release binaries (the product's and
# the lab's), the transport's unit tests (for their GPU-only cases, as gpulmt-unit), the
# C ABI examples, the PMPI shim, the internode mode's MPI programs, and the host's anchor programs (../shared/device, or
# ANCHORS=DIR, as .gpu/tools). The binaries are packed as .gpu/bin.tar.xz (unpacked into .gpu/bin by
# bench/gpu/preamble.sh; a script run here unpacks them here too: `rm -rf .gpu/bin` before the next call, which would
# carry them unpacked). Fails if .gpu and the tracked tree outgrow what a call may carry (64 MiB).
# Usage: bash bench/gpu/prepare.sh   then: bash bench/gpu/run.sh MODE OUTDIR there, carry [".gpu"]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --workspace --bins --quiet
cargo build --release -p gpulmt-shim -p gpulmt-ffi --quiet
# device_check, stencil2d and spts with MPI (device_check --offnode, Stencil2D and SpTS across pseudo-nodes
# under mpirun; under gpulmt-run they are the same as without).
cargo build --release -p gpulmt-bench --features mpi --bin device_check --bin stencil2d --bin spts --quiet
unit=$(cargo test --release -p gpulmt --lib --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep -v null | head -1)
rm -rf .gpu && mkdir -p .gpu/bin
for b in gpulmt-run gpulmt-check gpulmt-info osu_latency osu_bw osu_bibw stencil2d spts device_check bench-report \
  copy_probe copy_pingpong hostpath_cost window_probe server_probe ga_bench gpulmt-ga-check; do
  cp "target/release/$b" .gpu/bin/
done
cp target/release/libgpulmt_mpi.so .gpu/bin/
# The internode mode's programs, started by mpirun (feature `mpi`, linked to Open MPI's
# libmpi.so.40): the pseudo-node checks, the osu benchmarks as *_mpi, and osu_latency with
# the anatomy points as well. Built after the copies above: these builds replace the
# binaries of the same name in target/release.
cargo build --release -p gpulmt-tests --features mpi --bin gpulmt-mpi-nodes --quiet
cp target/release/gpulmt-mpi-nodes .gpu/bin/
cargo build --release -p gpulmt-ga --features mpi --bin gpulmt-ga-check --quiet
cp target/release/gpulmt-ga-check .gpu/bin/gpulmt-ga-check_mpi
cargo build --release -p gpulmt-bench --features mpi --bin osu_latency --bin osu_bw --bin osu_bibw --quiet
for b in osu_latency osu_bw osu_bibw; do cp "target/release/$b" ".gpu/bin/${b}_mpi"; done
cargo build --release -p gpulmt-bench --features mpi,gpulmt/anatomy --bin osu_latency --quiet
cp target/release/osu_latency .gpu/bin/osu_latency_anatomy_mpi
cp "$unit" .gpu/bin/gpulmt-unit
for ex in host pingpong ga; do
  cc -std=c11 -O2 -Iinclude "ffi/examples/$ex.c" -Ltarget/release -lgpulmt -Wl,-rpath,'$ORIGIN' -o ".gpu/bin/c_$ex"
done
cp target/release/libgpulmt.so .gpu/bin/
strip .gpu/bin/* 2>/dev/null || true
# The anchors: ../shared/device beside the main checkout, or two levels up from a worktree.
anchors=${ANCHORS:-}
for d in ../shared/device ../../shared/device; do
  [ -n "$anchors" ] || { [ -f "$d/anchors.sh" ] && anchors=$d; }
done
if [ -n "$anchors" ]; then
  cp -r "$anchors" .gpu/tools
else
  echo "prepare.sh: no anchors found (../shared/device; ANCHORS=DIR names them): the harness will skip them" >&2
fi
git rev-parse --short HEAD > .gpu/commit
git diff --quiet HEAD || echo "dirty" >> .gpu/commit
# A call carries 64 MiB with the working tree: the binaries travel packed (about a tenth of
# their size; bench/gpu/preamble.sh unpacks them there before the first use).
tar cJf .gpu/bin.tar.xz -C .gpu bin
rm -rf .gpu/bin
size=$(du -sm .gpu | cut -f1)
tree=$(git ls-files -z | du -cm --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo ".gpu: $size MiB, the tracked tree $tree MiB (a call carries at most 64 in all)"
[ $((size + tree)) -lt 64 ] || { echo "prepare.sh: .gpu and the tree are over 64 MiB" >&2; exit 1; }
