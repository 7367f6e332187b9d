#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The merge with one block per KV head's group (MergeGroupKernel) against
# the build before it (bundled as driftkv-server-cuda-before and
# service_hot_bench-before): the kernel tests, the kernel alone with the
# merge timed (both builds, alternating), then both servers alternating
# with their device stages timed.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtest attention_test 120
gtest level_attention_test 120
gtest cuda_backend_test 120
gtest window_cache_test 120
gtest data_plane_gpu_test 120
gtest service_gpu_test 120
for round in 1 2; do
  for v in service_hot_bench-before service_hot_bench; do
    echo "== kernel alone: $v"
    timeout 150 $B $v --sequences=64 --context=8192 --reps=40 --kernel_only_spread=8 2>&1 | tee $OUT/kernel_${v}_$round.log | tail -4
  done
done
VARIANTS="before:driftkv-server-cuda-before:DRIFTKV_DEVICE_TIMING=1 after:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=1" \
  ROUNDS=${ROUNDS:-2} PATHS="${PATHS:-ipc_prepared:0 shm_prepared:0 ipc_prepared:1}" bash bench/device/ab.sh
