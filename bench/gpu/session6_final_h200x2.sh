#!/usr/bin/env bash
# Session 6's last calls: protocols_repeat_h200x2.sh (5 rounds) into OUTDIR/repeat (the
# first call, gpulmt-run without binding; then ranks bound to cores by default), and with
# BIND_BOTH=1 the same with --bind none into OUTDIR/repeat_unbound.
# Usage: bash bench/gpu/session6_final_h200x2.sh OUTDIR   (after bench/gpu/prepare.sh; carry .gpu)
source "$(dirname "$0")/preamble.sh"
bash bench/gpu/protocols_repeat_h200x2.sh "$out/repeat" 5
if [ "${BIND_BOTH:-0}" = 1 ]; then RUN_FLAGS="--bind none" bash bench/gpu/protocols_repeat_h200x2.sh "$out/repeat_unbound" 5; fi
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
