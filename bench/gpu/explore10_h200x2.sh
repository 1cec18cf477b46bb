#!/usr/bin/env bash
# Session 7: where the 8 B D D latency goes, step by step, and the control ring that
# publishes packets by a per-slot stamp against the one before (which polled `tail`).
# Carried binaries: .gpu/bin (this commit), .gpu/old (osu_latency and gpulmt-run of
# 43f3a71, the session-6 reference), .gpu/anatomy (this commit built with the transport's
# `anatomy` feature). Runs: the anchors' small-copy latency, copy_probe 8, old and new
# osu_latency 8 B D D and H H in alternation (6 rounds each), then two anatomy runs
# (GPULMT_ANATOMY_OUT logs, lined up by bench/gpu/anatomy.py; OSU_ANATOMY beside them).
# Usage: bash bench/gpu/explore10_h200x2.sh OUTDIR   (packs OUTDIR.tgz)
source "$(dirname "$0")/preamble.sh"
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
nvidia-smi > "$out/host.txt" 2>&1
log anchors
bash .gpu/tools/anchors.sh 8 > "$out/anchors.csv" 2> "$out/anchors.err"
log copy_probe
$bin/copy_probe 8 > "$out/copy_probe_8.csv" 2>> "$out/log.txt"
lat() { # dir tag placement
  "$1/gpulmt-run" -n 2 --timeout 60 -- "$1/osu_latency" -m 8:8 -i 20000 --csv "$out/lat_$2.csv" $3 $3 > /dev/null 2>> "$out/log.txt"
}
for i in 1 2 3 4 5 6; do
  log round $i
  lat .gpu/old old_dd D; lat $bin new_dd D
  lat .gpu/old old_hh H; lat $bin new_hh H
done
for i in 1 2; do
  log anatomy $i
  OSU_ANATOMY=1 GPULMT_ANATOMY_OUT="$out/anat$i" .gpu/anatomy/gpulmt-run -n 2 --timeout 60 -- \
    .gpu/anatomy/osu_latency -m 8:8 -i 20000 D D > "$out/osu_anatomy$i.txt" 2>> "$out/log.txt"
  python3 bench/gpu/anatomy.py "$out/anat$i" > "$out/anatomy$i.csv" 2>> "$out/log.txt"
  gzip "$out/anat$i".*.csv
done
log done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
cp "$out.tgz" "${OUT:-/tmp}/" 2>/dev/null
cat "$out/anchors.csv" | grep ce_latency
for f in "$out"/lat_*.csv; do printf '%s ' "$(basename $f)"; tail -n +2 "$f" | cut -d, -f6 | tr '\n' ' '; echo; done
cat "$out/anatomy1.csv" "$out/anatomy2.csv"
grep -E "ipc_pull_(memcpy_streamsync|gpulmt)|push_memcpypeer" "$out/copy_probe_8.csv"
