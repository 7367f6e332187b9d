#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The CUDA IPC path's p99 at the shape the kernel alone is timed at: the
# GPU tests of the data plane, the kernel alone (64 x 8192, windows of
# 128/146/255 tokens), then ROUNDS fresh servers each taking STEPS (4000)
# steps of 8 layers of prepared CUDA IPC requests without a decode step
# (32,000 calls a server) after a prefill of 3 steps, so that every timed
# call attends 8192 + 6 tokens; calls over SLOW_US listed (stalls.sh); the
# kernel alone again at the end.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  gtests region_io_test:60 level_attention_test:120 cuda_backend_test:300 window_cache_test:300 \
    data_plane_gpu_test:120 service_gpu_test:120 || exit 1
fi
kernel() {
  echo "== kernel alone ($1)"
  timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=40 --kernel_only_spread=8 2>&1 |
    tee $OUT/kernel_$1.log | grep -E "hot kernel|window 1(28|46)"
}
kernel first
VARIANTS="${VARIANTS:-after:driftkv-server-cuda}" ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-4000} PREFILL_STEPS=3 \
  bash bench/device/stalls.sh
kernel last
