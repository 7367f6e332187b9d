#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The launch's queries uploaded and gathered before the host builds the
# page table (the device's copy and gather overlap it) and the query
# checks' flags copied back after the attention, against the build before
# (bundled as driftkv-server-cuda-before): the GPU tests, the kernel alone
# as the service runs it, then both servers alternating with their device
# stages timed, prepared requests without decode steps.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtest data_plane_gpu_test 120
gtest service_gpu_test 120
gtest cuda_backend_test 180
gtest region_io_test 60
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=40 --kernel_only_spread=8 2>&1 | tee $OUT/kernel.log | tail -4
VARIANTS="before:driftkv-server-cuda-before:DRIFTKV_DEVICE_TIMING=1 after:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=1" \
  ROUNDS=${ROUNDS:-3} PATHS="${PATHS:-ipc_prepared:0 shm_prepared:0}" bash bench/device/ab.sh
