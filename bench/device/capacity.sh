#!/bin/bash
# The levels at full size on the H200 (docs/tiers.md, "Capacity"): a 1 GiB
# pool, an 8 GiB host level and a 32 GiB disk level filled until Append is
# refused, every sequence checked; then the disk store against dd with the
# records in the blocks the probe chose (docs/tiers.md, "Figures").
# Needs .device/bundle with level_capacity_bench and disk_store_bench.
# Writes under $OUT.
set -u
B=.device/bundle/run
rm -rf /tmp/cap && mkdir -p /tmp/cap
timeout 420 $B level_capacity_bench --disk_dir=/tmp/cap/level --pool_mib=1024 --host_mib=8192 --disk_mib=32768 \
    --forks=${FORKS:-320} 2>&1 | tee $OUT/capacity.log
rm -rf /tmp/cap /tmp/ds && mkdir -p /tmp/ds
timeout 150 $B disk_store_bench /tmp/ds/a 1024 16 4 256 2000 3 2>&1 | tee $OUT/disk_store.log
rm -rf /tmp/ds && mkdir -p /tmp/ds
timeout 150 $B disk_store_bench /tmp/ds/b 1024 32 8 256 0 3 2>&1 | tee $OUT/disk_store_32.log
