#!/bin/bash
# The host-memory level on the H200 (docs/tiers.md, "The host level"): the
# GPU tests of the page copies and of the levels, page_copy_bench (the
# host level's copies beside the copy engines), then host_level_bench
# twice with the host level alone (restores of 8K x 32-layer sequences
# from page-locked host memory, into room and swapping, and Attend after
# Prefetch against a resident one) and once with a disk level below it.
# Needs .device/bundle with page_copy_test, disk_level_gpu_test,
# cuda_backend_test, page_copy_bench and host_level_bench. Writes under $OUT.
set -u
B=.device/bundle/run
. bench/device/gtest.sh
nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv | tee $OUT/gpu.txt
gtests page_copy_test:120 disk_level_gpu_test:240 cuda_backend_test:240 || exit 1
$B page_copy_bench --reps=20 2>&1 | tee $OUT/page_copy.log
for round in $(seq 1 ${ROUNDS:-2}); do
  echo "== host_level_bench round $round" | tee -a $OUT/host_level.log
  $B host_level_bench --layers=32 --tokens=8320 --pool_seqs=8 --host_mib=${HOST_MIB:-4096} \
      --sequences=${SEQUENCES:-30} --room=6 2>&1 | tee -a $OUT/host_level.log
done
if [ -n "${DISK_MIB:-}" ]; then
  rm -rf /tmp/hl && mkdir -p /tmp/hl
  echo "== host_level_bench, host 1 GiB over a disk level" | tee -a $OUT/host_level.log
  $B host_level_bench --layers=32 --tokens=8320 --pool_seqs=4 --host_mib=1024 --disk_dir=/tmp/hl/level \
      --disk_mib=$DISK_MIB --sequences=20 --room=3 2>&1 | tee -a $OUT/host_level.log
fi
