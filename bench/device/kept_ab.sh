#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Launch plans kept on the device (backends/cuda/launch_plans.h), the
# gather's check flags stored straight into pinned host memory and the
# kernels' shared-memory limit set once, against the build before them
# (bundled as driftkv-server-cuda-before): the GPU tests of the gather, the
# CUDA backend and the data plane, the kernel alone as the service runs it,
# then three servers alternating (before; after; after with
# DRIFTKV_KEPT_PLANS=0, which isolates the kept plans), ROUNDS rounds.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  gtests region_io_test:60 level_attention_test:120 cuda_backend_test:300 window_cache_test:300 \
    data_plane_gpu_test:120 service_gpu_test:120 || exit 1
fi
if [ "${KERNEL:-1}" = 1 ]; then
  echo "== kernel alone"
  timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=40 --kernel_only_spread=8 2>&1 | tee $OUT/kernel.log | tail -4
fi
VARIANTS="${VARIANTS:-before:driftkv-server-cuda-before after:driftkv-server-cuda nokept:driftkv-server-cuda:DRIFTKV_KEPT_PLANS=0}" \
  ROUNDS=${ROUNDS:-2} PATHS="${PATHS:-ipc_prepared:0 shm_prepared:0 ipc_prepared:1}" bash bench/device/ab.sh
