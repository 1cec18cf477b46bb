# Sourced by the lab's GPU scripts (`source "$(dirname "$0")/lab.sh" OUTDIR`, arguments
# passed on): bench/gpu/preamble.sh (strict mode, $out, $bin, log, MPS, build_cuda_osu),
# then the A/B helpers the investigations share: `small_copy_baselines`, `append_rows`,
# `osu_rows`, `rotated_rounds`, `median_table`, `variant_medians` and the PMPI shim's
# `shim_latency`.
source "$(dirname "${BASH_SOURCE[0]}")/../../bench/gpu/preamble.sh"
# The small-copy ceilings of this call, for scripts about the 8 B latency: the host's
# GPUs, the anchors' 8 B copy-and-wait and copy_probe 8.
small_copy_baselines() {
  nvidia-smi > "$out/host.txt" 2>&1
  log anchors
  bash .gpu/tools/anchors.sh 8 > "$out/anchors.csv" 2> "$out/anchors.err"
  log copy_probe
  $bin/copy_probe 8 > "$out/copy_probe_8.csv" 2>> "$out/log.txt"
}
# Appends the rows of an osu benchmark's --csv file ($3) to $4 as
# `variant,round,bench,bytes,metric,value` (variant $1, round $2; its header, placement
# and protocol columns dropped).
append_rows() {
  tail -n +2 "$3" 2>/dev/null | cut -d, -f1,4- | sed "s/^/$1,$2,/" >> "$4"
}
# Runs an osu benchmark ($5, arguments after it) D D on two ranks with the comma-separated
# variable assignments $3, appends its rows to $4 as variant $1, round $2 (see
# append_rows), and keeps the ranks' traffic counters and warnings in $out/stats_$1.txt.
osu_rows() {
  local v=$1 r=$2 envs=${3//,/ } csv=$4; shift 4
  rm -f /tmp/osu_rows.csv
  env GPULMT_LOG=gpulmt=info $envs $bin/gpulmt-run -n 2 --timeout 120 -- "$bin/$@" --csv /tmp/osu_rows.csv D D \
    > /dev/null 2> >(grep -E "traffic of this rank|ERROR|WARN" | sed "s/^/round $r $1: /" >> "$out/stats_$v.txt") \
    || echo "$v round $r $1 failed" >> "$out/log.txt"
  append_rows "$v" "$r" /tmp/osu_rows.csv "$csv"
}
# For each of ROUNDS rounds (default $3), calls `$2 NAME ROUND FIELD...` for every variant
# `NAME:FIELD:...` of the space-separated list $1, starting one variant later each round so
# that none always runs first (empty fields, as in `off:X=1:`, are passed empty or left out).
rotated_rounds() {
  local -a vs f
  read -r -a vs <<< "${1//$'\n'/ }"
  local r k n=${#vs[@]}
  for r in $(seq "${ROUNDS:-$3}"); do
    log "round $r"
    for k in $(seq 0 $(( n - 1 ))); do
      IFS=: read -r -a f <<< "${vs[$(( (k + r) % n ))]}"
      "$2" "${f[0]}" "$r" "${f[@]:1}"
    done
  done
}
# Prints, from CSV $1 with columns `variant` and `size` and the value columns named after it,
# the median of each value per variant (a row each, in order of first appearance) and size.
median_table() {
  python3 - "$@" <<'EOF'
import csv, statistics, sys
path, cols = sys.argv[1], sys.argv[2:]
rows = list(csv.DictReader(open(path)))
sizes = sorted({r["size"] for r in rows}, key=int)
print("variant," + ",".join(f"{s} {c}" for s in sizes for c in cols))
for v in dict.fromkeys(r["variant"] for r in rows):
    cells = []
    for s in sizes:
        for c in cols:
            x = [float(r[c]) for r in rows if r["variant"] == v and r["size"] == s and r[c]]
            cells.append(f"{statistics.median(x):.1f}" if x else "nan")
    print(v + "," + ",".join(cells))
EOF
}
# Prints, from CSV $1 with columns `variant` and `us` (a row per run), each variant's
# median and its runs.
variant_medians() {
  python3 - "$1" <<'EOF'
import csv, statistics, sys
v = {}
for r in csv.DictReader(open(sys.argv[1])):
    if r["us"]: v.setdefault(r["variant"], []).append(float(r["us"]))
for k, x in v.items():
    print(f"{k}: median {statistics.median(x):.2f} us  runs {' '.join(f'{y:.2f}' for y in x)}")
EOF
}
# Prints cuda_osu's 8 B D D latency (us) on two ranks under the shim ($SHIM_LIB, default
# the carried one), with the variable assignments $2... (one `-x` each); a failed byte
# check goes to $out/checks.txt and the log, named $1.
shim_latency() {
  local name=$1 x="" e lib=${SHIM_LIB:-$PWD/$bin/libgpulmt_mpi.so}; shift
  for e in "$@"; do x="$x -x $e"; done
  # shellcheck disable=SC2086
  timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x LD_PRELOAD=$lib \
    -x GPULMT_DEVICE=cuda $x /tmp/cuda_osu 1048576 > /tmp/cuda_osu.out 2>> "$out/log.txt"
  if grep -q ",check,.*,ok,0" /tmp/cuda_osu.out; then
    echo "$name: a byte check failed" | tee -a "$out/checks.txt" >> "$out/log.txt"
    cat /tmp/cuda_osu.out >> "$out/log.txt"
  fi
  grep ',lat,D D,8,' /tmp/cuda_osu.out | cut -d, -f6
}
