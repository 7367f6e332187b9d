#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Buffers sized at start and window tokens through the upload ring: the
# CUDA backend's and the service's GPU tests, then service_hot_bench of the
# build before (service_hot_bench-before) and after, two rounds
# alternating; each prints its first and second Attend by phase.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
gtest cuda_backend_test 150
gtest service_gpu_test 100
gtest data_plane_gpu_test 80
for round in 1 2; do
  for v in before after; do
    bin=service_hot_bench
    [ $v = before ] && bin=service_hot_bench-before
    echo "== round $round: $v" | tee -a $OUT/hot_bench.log
    timeout 150 $B $bin --sequences=64 --context=8192 --reps=20 --clients=8 2>&1 | tee -a $OUT/hot_bench.log |
      grep -E "^\| (hot|cold)|Attend .* phases"
  done
done
