#!/usr/bin/env bash
# Builds of the product's benchmarks side by side on one GPU under MPS, rounds in
# alternation (A B C, C B A, ...): on the node (gpulmt-run: osu_latency D D and H H, osu_bw
# D D) and across 2 pseudo-nodes (mpirun: osu_latency D D and H H), for a change that
# touches both paths. Binaries in .gpu/bin: osu_latency, osu_bw, osu_latency_mpi for
# build a (prepare.sh's), the same names with _b, _c, ... for the builds BUILDS names
# (default "a b").
# Writes <what>_<build>_<round>_<pl>.csv and summary.txt (the rounds side by side).
# Usage: BUILDS="a b c" ROUNDS=2 LAT_SIZES=8:4M BW_SIZES=8:64M [PARTS="node_lat net_lat node_bw"]
#        bash lab/gpu/build_ab.sh OUTDIR   (OUTDIR.tgz)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: build_ab.sh OUTDIR}"
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
parts=${PARTS:-node_lat net_lat node_bw}
want() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
pn="mpirun --allow-run-as-root --oversubscribe --bind-to none -x GPULMT_DEVICE -x GPULMT_PSEUDO_NODES=2"
MPS=1 start_mps
for r in $(seq "${ROUNDS:-2}"); do
  builds=${BUILDS:-a b}
  [ $((r % 2)) = 0 ] && builds=$(echo "$builds" | tr ' ' '\n' | tac | tr '\n' ' ')
  for b in $builds; do
    s=""; [ $b = a ] || s=_$b
    for pl in "D D" "H H"; do
      if want node_lat; then
        log "round $r build $b node latency $pl"
        timeout 120 "$bin/gpulmt-run" -n 2 --timeout 110 -- "$bin/osu_latency$s" -m "${LAT_SIZES:-8:4M}" \
          --csv "$out/node_lat_${b}_${r}_${pl// /}.csv" $pl > /dev/null 2>> "$out/log.txt" || log "FAILED"
      fi
      if want net_lat; then
        log "round $r build $b net latency $pl"
        timeout 120 $pn -np 2 "$bin/osu_latency_mpi$s" -m "${LAT_SIZES:-8:4M}" \
          --csv "$out/net_lat_${b}_${r}_${pl// /}.csv" $pl > /dev/null 2>> "$out/log.txt" || log "FAILED"
      fi
    done
    if want node_bw; then
      log "round $r build $b node bw D D"
      timeout 120 "$bin/gpulmt-run" -n 2 --timeout 110 -- "$bin/osu_bw$s" -m "${BW_SIZES:-8:64M}" \
        --csv "$out/node_bw_${b}_${r}_DD.csv" D D > /dev/null 2>> "$out/log.txt" || log "FAILED"
    fi
  done
  pack
done
stop_mps
python3 - "$out" > "$out/summary.txt" <<'PY'
import csv, glob, os, re, sys
from collections import defaultdict
runs = defaultdict(dict)  # (what, pl) -> {(build, round): {bytes: value}}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_*_*_*_*.csv"))):
    m = re.match(r"(node_lat|net_lat|node_bw)_(\w)_(\d+)_(\w+)\.csv", os.path.basename(f))
    if not m:
        continue
    with open(f) as fh:
        runs[(m[1], m[4])][(m[2], int(m[3]))] = {int(r["bytes"]): float(r["value"]) for r in csv.DictReader(fh)}
for (what, pl), cols in sorted(runs.items()):
    keys = sorted(cols)
    print(f"## {what} {pl} ({'GB/s' if 'bw' in what else 'us'}), build/round: " + " ".join(f"{b}{r}" for b, r in keys))
    for n in sorted({n for c in cols.values() for n in c}):
        print(n, " ".join(f"{cols[k].get(n, float('nan')):.2f}" for k in keys))
PY
log done
pack
true
