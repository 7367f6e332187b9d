#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The GPU tests of the CUDA backend and the data plane; the hot kernel alone
# with its pages packed and spread apart; the 32-layer decode step on the
# doorbell paths, prepared and plain, with the server's phases; local SDPA.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtest data_plane_gpu_test 90
gtest cuda_backend_test 60
gtest window_cache_test 60
gtest service_gpu_test 60
echo "== hot kernel alone, pages packed / spread"
timeout 120 $B service_hot_bench --sequences=64 --context=8192 --reps=30 --kernel_only_spread=${SPREAD:-8} 2>&1 | tail -4
PATHS="${PATHS:-ipc_prepared:0 shm_prepared:0 ipc_doorbell:0 shm_doorbell:0 ipc_prepared:1 shm_prepared:1 ipc_doorbell:1 shm_doorbell:1}" \
  STEPS=15 bash bench/device/phases.sh 2>&1 | cut -c1-420
echo "== local SDPA"
timeout 90 python3 bench/decode_step_sdpa.py --layers 32 --batch 64 --context 8192 --steps 15 2>&1 | tail -3
