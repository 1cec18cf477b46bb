#!/usr/bin/env bash
# Windows of small messages (64 KiB - 4 MiB), where osu_bw D D reads 0.69-0.78 of the raw
# copy engine and osu_bibw 0.46-0.62 of its two-way anchor, and where GET and PUT trade
# places between runs: is it the driver's CPU cost per copy (issue about 2 us, a query
# answering "done" 1.4 us) that binds, and do the two answers to it help?
#   GPULMT_POLL_NEWEST=1    a long copy queue is asked newest first, so one "done" retires
#                           a window (the CUDA backend answers older tickets from memory);
#   GPULMT_BALANCE_MAX=SIZE a window from one sender is spread over both engines, so both
#                           processes issue copies (default 2M since one H200 under MPS
#                           read +65-78 % in osu_bw: h200x1/windows3_mps_balance, git
#                           history at c15a975);
#   GPULMT_BIDIR_PUT_MIN    64K by default since PUT beat GET in osu_bibw at 64-256 KiB in
#                           runs 13-16; `bidir512k` is the old default.
# The default variants set each back to its old value, one at a time, against auto.
# In one call: the CUDA backend's GPU unit tests (the window test checks the newest-first
# answers), correctness checks with both settings on, the anchors up to 4 MiB, then ROUNDS
# rotated rounds of osu_bw and osu_bibw 64 KiB - 4 MiB and osu_latency 8 B D D per variant
# (VARIANTS: space-separated `name:ENV=VALUE[,ENV=VALUE]`). Each run logs its ranks'
# traffic counters (protocols, copies, copies found by probing) to stats_<variant>.txt.
# Rows go to OUTDIR/windows.csv as `variant,round,bench,bytes,metric,value`; the table
# printed last holds each cell's median, its ratio to the best variant of that cell and
# to the anchor (ce_peer / ce_peer_bi / the anchors' 8 B copy-and-wait).
# QUICK=1 skips the unit tests, checks and anchors; MPS=1 runs the rounds under NVIDIA MPS
# (two ranks on one GPU are time-sliced without it).
# Usage: [VARIANTS=...] [ROUNDS=3] [QUICK=1] [MPS=1] bash lab/gpu/windows.sh OUTDIR   (after prepare.sh; carry .gpu)
source "$(dirname "$0")/lab.sh"
variants=${VARIANTS:-auto:X=1 nobal:GPULMT_BALANCE_MAX=0 bal512k:GPULMT_BALANCE_MAX=512K bidir512k:GPULMT_BIDIR_PUT_MIN=512K oldest:GPULMT_POLL_NEWEST=0 get:GPULMT_PROTOCOL=get put:GPULMT_PROTOCOL=put}
nvidia-smi > "$out/host.txt" 2>&1
if [ "${QUICK:-0}" != 1 ]; then
log unit
$bin/gpulmt-unit --ignored --test-threads=1 device::cuda > "$out/unit.txt" 2>&1
log checks
check() { # name env-assignments(comma-separated) gpulmt-check args...
  local name=$1 envs=${2//,/ }; shift 2
  if env $envs $bin/gpulmt-run -n 2 --timeout 120 -- $bin/gpulmt-check "$@" > "$out/check_$name.txt" 2>&1; then
    echo "check $name: ok" >> "$out/checks.txt"
  else
    echo "check $name: FAILED" >> "$out/checks.txt"
  fi
}
both=GPULMT_POLL_NEWEST=1,GPULMT_BALANCE_MAX=2M
check window_both "$both" window --placement "D D" --count 64 --sizes 65536,65537,262144,1048576 --same-tag
check window_split "$both,GPULMT_COPY_SPLIT=64K" window --placement "D D" --count 32 --sizes 1048576,4194304 --same-tag
check pingpong_both "$both" pingpong --placement "D D" --sizes 1,4096,65536,65537,1048576,67108864 --offset 4096
check alltoall_both "$both" alltoall --iters 20
log anchors
bash .gpu/tools/anchors.sh 4194304 > "$out/anchors.csv" 2> "$out/anchors.err"
fi
[ -f "$out/anchors.csv" ] || echo "anchor,metric,bytes,value" > "$out/anchors.csv"
start_mps
echo "mps=$mps" > "$out/env.txt"
echo "variant,round,bench,bytes,metric,value" > "$out/windows.csv"
window_variant() { # name round envs
  osu_rows "$1" "$2" "${3:-}" "$out/windows.csv" osu_bw -m 64K:4M
  osu_rows "$1" "$2" "${3:-}" "$out/windows.csv" osu_bibw -m 64K:4M
  osu_rows "$1" "$2" "${3:-}" "$out/windows.csv" osu_latency -m 8:8 -i 20000
}
rotated_rounds "$variants" window_variant 3
log done
stop_mps
cat "$out/env.txt" "$out/checks.txt" 2>/dev/null
grep -E "test result" "$out/unit.txt" | tail -3
for f in "$out"/stats_*.txt; do echo "$(basename "$f" .txt): $(grep -m2 "osu_bw" "$f" | grep -oE " (get|put|copies|probed)=[0-9]+" | tr '\n' ' ')"; done
python3 - "$out/windows.csv" "$out/anchors.csv" > "$out/windows_table.csv" <<'PY'
import csv, sys, collections
cell = collections.defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    # osu_bw / osu_bibw write MB/s, the anchors GB/s.
    scale = 1e-3 if r["metric"] == "MBps" else 1.0
    cell[(r["bench"], int(r["bytes"]), r["variant"])].append(float(r["value"]) * scale)
anchor = {}
for r in csv.DictReader(open(sys.argv[2])):
    anchor.setdefault((r["anchor"], int(r["bytes"])), float(r["value"]))
def med(v): v = sorted(v); return v[len(v) // 2]
which = {"osu_bw": "ce_peer", "osu_bibw": "ce_peer_bi", "osu_latency": "ce_latency"}
print("bench,bytes,variant,median_GBps_or_us,vs_best,anchor,anchor_value,vs_anchor,values")
for bench, size in sorted({(b, s) for b, s, _ in cell}):
    meds = {v: med(cell[(b, s, v)]) for b, s, v in cell if (b, s) == (bench, size)}
    lat = bench == "osu_latency"
    best = min(meds.values()) if lat else max(meds.values())
    a = which[bench]
    av = anchor.get((a, size)) if not lat else anchor.get((a, 8))
    for v, m in sorted(meds.items()):
        vb = best / m if lat else m / best
        va = (av / m if lat else m / av) if av else float("nan")
        vals = " ".join(f"{x:.2f}" for x in cell[(bench, size, v)])
        print(f"{bench},{size},{v},{m:.3f},{vb:.3f},{a},{av if av else ''},{va:.3f},{vals}")
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
cut -d, -f1-5,8 "$out/windows_table.csv"
