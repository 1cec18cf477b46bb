#!/usr/bin/env bash
# Why a rank's driver calls sometimes run twice as slow (anatomy of explore11/latab12: copy
# issue 1.8 -> 2.9 us, polls per copy 22 -> 11, switching mid-run, one rank at a time).
# Records the host (virtualisation, clock source, irqbalance, NVIDIA interrupt affinity),
# then runs the anatomy build's osu_latency 8 B D D with the ranks pinned by taskset to
# several CPU pairs (two rotated rounds), snapshotting /proc/interrupts and /proc/stat
# (steal time) around each run; and copy_probe pinned to CPU 0 and to CPU 9.
# Prints per run: latency, each rank's issue cost and polls, interrupts and steal on its CPU.
# Usage: bash bench/gpu/noise_h200x2.sh OUTDIR   (after prepare.sh with .gpu/anatomy; carry .gpu)
source "$(dirname "$0")/preamble.sh"
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt" >&2; }
{ lscpu; lscpu -e; systemd-detect-virt; cat /sys/devices/system/clocksource/clocksource0/current_clocksource
  pgrep -a irqbalance; cat /proc/irq/default_smp_affinity; uptime; ps -eo pid,psr,pcpu,comm --sort=-pcpu | head -15; } > "$out/env.txt" 2>&1
for irq in $(grep -i nvidia /proc/interrupts | cut -d: -f1); do
  echo "$irq $(cat /proc/irq/$irq/smp_affinity_list) $(cat /proc/irq/$irq/effective_affinity_list 2>/dev/null)"
done > "$out/nvidia_irqs.txt"
snap() { cat /proc/interrupts > "$out/$1.irq"; grep '^cpu' /proc/stat > "$out/$1.stat"; }
run() { # name cpu_of_rank0 cpu_of_rank1
  log "run $1 on $2+$3"
  snap "$1.before"
  OSU_ANATOMY=1 GPULMT_ANATOMY_OUT="$out/anat_$1" .gpu/anatomy/gpulmt-run -n 2 --bind none --timeout 60 -- \
    sh -c "exec taskset -c \$([ \$GPULMT_RANK = 0 ] && echo $2 || echo $3) .gpu/anatomy/osu_latency -m 8:8 -i 20000 D D" \
    > "$out/osu_$1.txt" 2>> "$out/log.txt"
  snap "$1.after"
  echo "$2 $3" > "$out/$1.cpus"
  python3 bench/gpu/anatomy.py "$out/anat_$1" > "$out/anatomy_$1.csv" 2>> "$out/log.txt"
  gzip -f "$out/anat_$1".*.csv
}
pairs=("0 1" "2 3" "8 9" "16 24" "30 31")
for r in 1 2; do
  for k in 0 1 2 3 4; do run "r${r}_p$k" ${pairs[$(( (k + r) % 5 ))]}; done
done
for c in 0 9; do
  log "copy_probe on $c"; snap "probe$c.before"
  taskset -c $c $bin/copy_probe 8 > "$out/copy_probe_cpu$c.csv" 2>> "$out/log.txt"; snap "probe$c.after"
done
log done
# Raw anatomy logs stay out of the archive: with them it is over the device tool's size limit.
tar czf "$out.tgz" --exclude="anat_*.csv.gz" -C "$(dirname "$out")" "$(basename "$out")"
python3 - "$out" <<'PY'
import glob, os, sys
out = sys.argv[1]
def irq(path):
    rows = {}
    lines = open(path).read().splitlines()
    ncpu = len(lines[0].split())
    for l in lines[1:]:
        name, rest = l.split(":", 1)
        f = rest.split()
        vals = [int(x) for x in f[:ncpu] if x.isdigit()]
        if len(vals) == ncpu:
            rows[name.strip()] = (vals, " ".join(f[ncpu:])[-30:])
    return rows
def stat(path):
    return {l.split()[0]: [int(x) for x in l.split()[1:]] for l in open(path)}
def delta(name, cpu):
    a, b = irq(f"{out}/{name}.before.irq"), irq(f"{out}/{name}.after.irq")
    tot = sum(b[k][0][cpu] - a[k][0][cpu] for k in b if k in a)
    top = sorted(((b[k][0][cpu] - a[k][0][cpu], k + " " + b[k][1]) for k in b if k in a), reverse=True)[:2]
    sa, sb = stat(f"{out}/{name}.before.stat"), stat(f"{out}/{name}.after.stat")
    steal = sb[f"cpu{cpu}"][7] - sa[f"cpu{cpu}"][7]
    return tot, top, steal
print("run,cpus,latency_us,issue0,polls0,irq0,steal0,issue1,polls1,irq1,steal1,top_irq0")
for cpus in sorted(glob.glob(f"{out}/r*_p*.cpus")):
    name = os.path.basename(cpus)[:-5]
    c = [int(x) for x in open(cpus).read().split()]
    lat = next((l.split()[-1] for l in open(f"{out}/osu_{name}.txt") if l.strip().startswith("8 ")), "?")
    an = {l.split(",")[0]: l.split(",")[1] for l in open(f"{out}/anatomy_{name}.csv")}
    cols = [name, "+".join(map(str, c)), lat]
    tops = ""
    for rank in (0, 1):
        tot, top, steal = delta(name, c[rank])
        cols += [an.get(f"rank {rank}: copy issue (driver calls)", "?"), an.get(f"rank {rank}: copy polls (median)", "?"), str(tot), str(steal)]
        if rank == 0: tops = "; ".join(f"{n}x {d}" for n, d in top)
    print(",".join(cols) + "," + tops)
for c in (0, 9):
    tot, top, steal = delta(f"probe{c}", c)
    call = [l.split(",")[2] for l in open(f"{out}/copy_probe_cpu{c}.csv") if "ipc_pull_call_memcpyasync" in l or "ipc_pull_memcpy_eventquery" in l]
    print(f"probe on cpu{c}: ipc_pull eventquery/call {call} irq {tot} steal {steal} top {top}")
print(open(f"{out}/nvidia_irqs.txt").read())
PY
