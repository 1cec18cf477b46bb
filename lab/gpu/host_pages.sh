#!/usr/bin/env bash
# lab/gpu/host_pages.cu on one GPU, without MPS and under it, with what the host says of its
# IOMMU, transparent huge pages, reserved huge pages and the GPU's PCIe link.
# Usage: bash lab/gpu/host_pages.sh OUTDIR   (host_pages_{plain,mps}.csv, host.txt, log.txt)
source "$(dirname "$0")/../../bench/gpu/preamble.sh" "${1:?usage: host_pages.sh OUTDIR}"
{
  echo "iommu groups: $(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)"; ls /sys/class/iommu 2>&1
  echo "cmdline: $(cat /proc/cmdline 2>&1)"
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>&1)"
  grep -i huge /proc/meminfo
  echo 64 > /proc/sys/vm/nr_hugepages 2>&1 && echo "reserved 64 huge pages: $(grep HugePages_Total /proc/meminfo)"
  nvidia-smi -q 2>&1 | grep -iA3 "GPU Link Info\|Link Width\|PCIe Generation" | head -20
  nvidia-smi topo -m 2>&1 | head -5
  dmesg 2>&1 | grep -iE "iommu|dmar|amd-vi" | head -10
} > "$out/host.txt" 2>&1
have_nvcc && nvcc -O2 -arch=sm_90 lab/gpu/host_pages.cu -lcuda -o /tmp/host_pages 2>> "$out/log.txt" || { log "build failed"; exit 1; }
timeout 120 /tmp/host_pages "${ITERS:-2000}" > "$out/host_pages_plain.csv" 2>> "$out/log.txt" || log "plain FAILED"
MPS=1 start_mps
timeout 120 /tmp/host_pages "${ITERS:-2000}" > "$out/host_pages_mps.csv" 2>> "$out/log.txt" || log "mps FAILED"
stop_mps
log done
