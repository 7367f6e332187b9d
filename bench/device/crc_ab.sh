#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Page checksums summed on the device and promotion in one round trip,
# against the build before (bundled as driftkv-server-cuda-before and
# service_hot_bench-before): the GPU tests, service_hot_bench (the first
# Attend of the hot server promotes 64 layers of 8K) alternating, then
# the 32-layer decode step over 130 steps (one seals a page in every
# layer) on both servers.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtest page_crc_test 60
gtest cuda_backend_test 180
gtest window_cache_test 180
gtest service_gpu_test 120
gtest data_plane_gpu_test 120
for round in 1 2; do
  for b in service_hot_bench-before service_hot_bench; do
    echo "== round $round: $b"
    timeout 200 $B $b --sequences=64 --context=8192 --reps=20 --clients=8 2>&1 | tee -a $OUT/hot_bench.log | grep -E "^\| (hot|cold)|bit-equal" | tail -4
  done
done
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" ROUNDS=1 STEPS=130 \
  SHAPE="--layers=32 --sequences=64 --context=8192" PATHS="shm_prepared:1" bash bench/device/ab.sh
