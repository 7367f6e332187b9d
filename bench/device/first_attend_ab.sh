#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The first Attend against the build before (service_hot_bench-before):
# the checksum and service GPU tests, bench_gpu's checksum lines against a
# build with the earlier checksum kernel (bench_gpu-mid), then
# service_hot_bench, ROUNDS (default 2) rounds alternating. Each build
# runs as it ships: the build before loads CUDA modules lazily, this one
# eagerly (service/process_env.h). Last, when bundled, tier_demotion_bench:
# an 8K x 32-layer sequence's demotion with and without cold copies.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-page_crc_test:60 service_gpu_test:300} || exit 1
for v in bench_gpu-mid bench_gpu; do
  echo "== 1 x 8K: $v"
  timeout 90 $B $v --encode_tokens=0 --shapes=1x8192 > $OUT/${v}.log 2>&1
  grep -E "^Promotion|^Demotion|^Checksums" $OUT/${v}.log
done
for round in $(seq ${ROUNDS:-2}); do
  for v in service_hot_bench-before service_hot_bench; do
    echo "== round $round: $v" | tee -a $OUT/hot_bench.log
    timeout 150 $B $v --sequences=64 --context=8192 --reps=20 --clients=8 2>&1 | tee -a $OUT/hot_bench.log |
      grep -E "^\| (hot|cold)|Attend .* phases"
  done
done
if [[ -e .device/bundle/bin/tier_demotion_bench ]]; then
  echo "== demotion with and without cold copies, 8K x 32 layers"
  timeout 240 $B tier_demotion_bench --backend=cuda --layers=32 --tokens=8320 --rounds=5 2>&1 |
    tee $OUT/tier_demotion.log | grep -E "^(backend|copies|no copies|demotion)"
fi
