#!/usr/bin/env bash
# Builds gpulmt's C library and installs it under PREFIX:
#
#   PREFIX/include/gpulmt.h
#   PREFIX/include/gpulmt_device.cuh   (the device API: include it in CUDA kernels)
#   PREFIX/lib/libgpulmt.so  PREFIX/lib/libgpulmt.a
#   PREFIX/lib/pkgconfig/gpulmt.pc
#
# usage: ffi/install.sh PREFIX
#   GPULMT_INSTALL_PROFILE=debug installs a debug build instead of the release one.
#
# Then, with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig:
#   cc $(pkg-config --cflags gpulmt) prog.c $(pkg-config --libs gpulmt)
# (the .pc file sets an rpath to PREFIX/lib, so programs find the library there), or
# statically:
#   cc $(pkg-config --cflags gpulmt) prog.c PREFIX/lib/libgpulmt.a \
#      $(pkg-config --variable=native_static_libs gpulmt)
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -eq 1 ] && [ -n "$1" ] || usage
case $1 in -h|--help) usage ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
profile=${GPULMT_INSTALL_PROFILE:-release}
case $profile in
  release) flags=(--release) ;;
  debug) flags=() ;;
  *) echo "GPULMT_INSTALL_PROFILE must be release or debug, not $profile" >&2; exit 2 ;;
esac

# Build through `cargo rustc` to learn which system libraries the static library
# needs; when the build is already fresh rustc does not run and prints nothing, and the
# list of the last build that printed it is used.
target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
out="$target_dir/$profile"
native_file="$out/libgpulmt.native-static-libs"
log=$(cd "$root" && cargo rustc -p gpulmt-ffi --lib "${flags[@]}" -- --print native-static-libs 2>&1) || {
  printf '%s\n' "$log" >&2
  exit 1
}
native=$(printf '%s\n' "$log" | sed -n 's/.*native-static-libs: //p' | tail -n 1)
if [ -n "$native" ]; then
  printf '%s\n' "$native" >"$native_file"
elif [ -f "$native_file" ]; then
  native=$(cat "$native_file")
else
  # What Rust's standard library needs on Linux.
  native="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
fi

# `cargo pkgid` ends with the version: path+file:///.../ffi#gpulmt-ffi@0.1.0
version=$(cd "$root" && cargo pkgid -p gpulmt-ffi | sed 's/.*[@#]//')

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$root/include/gpulmt.h" "$prefix/include/gpulmt.h"
install -m 644 "$root/include/gpulmt_device.cuh" "$prefix/include/gpulmt_device.cuh"
install -m 755 "$out/libgpulmt.so" "$prefix/lib/libgpulmt.so"
install -m 644 "$out/libgpulmt.a" "$prefix/lib/libgpulmt.a"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@NATIVE_STATIC_LIBS@|$native|g" \
  "$root/include/gpulmt.pc.in" >"$prefix/lib/pkgconfig/gpulmt.pc"
echo "installed gpulmt $version ($profile) in $prefix"
