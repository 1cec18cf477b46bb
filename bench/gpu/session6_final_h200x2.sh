#!/usr/bin/env bash
# Session 6's last call: protocols_repeat_h200x2.sh (5 rounds) into OUTDIR/repeat.
# Usage: bash bench/gpu/session6_final_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
cat .gpu/commit > "$out/commit.txt"
bash bench/gpu/protocols_repeat_h200x2.sh "$out/repeat" 5
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
