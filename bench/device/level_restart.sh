#!/bin/bash
# The levels through a drain and a restart on the H200 (docs/tiers.md,
# "Restart"): the GPU tests of the levels, then service_drain_test against
# driftkv-server-cuda (its levels test: 40 sequences over a 1 MiB pool
# with a host level and a disk level, SIGTERM, restart, answers compared,
# kill -9 while moving down, restart). Also what the machine's disk takes
# for O_DIRECT (the records' alignment). Needs .device/bundle with
# disk_level_gpu_test, service_drain_test and driftkv-server-cuda.
# Writes under $OUT.
set -u
. bench/device/gtest.sh
{ lsblk -o NAME,LOG-SEC,PHY-SEC,MOUNTPOINT; df -h /tmp; } | tee $OUT/disk.txt
for bs in 512 4096; do
  echo "O_DIRECT write of $bs bytes under /tmp: $(dd if=/dev/zero of=/tmp/odirect_probe bs=$bs count=1 oflag=direct 2>&1 | tail -1)" | tee -a $OUT/disk.txt
done
gtests disk_level_gpu_test:300
echo "== drain + restart with levels on driftkv-server-cuda"
DRIFTKV_DRAIN_BACKEND=cuda timeout 400 $B service_drain_test $PWD/.device/bundle/bin/driftkv-server-cuda > $OUT/drain.log 2>&1
echo "service_drain_test (cuda) rc=$? $(grep -E '^\[       OK|^\[  FAILED|^\[  PASSED' $OUT/drain.log | tr '\n' ' ')"
grep -a -E "restored|snapshot of|stay in the disk|no snapshot" $OUT/drain.log | cut -c1-400 | tail -12
