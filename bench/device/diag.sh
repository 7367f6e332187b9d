#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A shorter device call than final.sh: the GPU tests, then the decode-step
# benchmark's single-layer paths (no decode step) and the doorbell paths
# with steps, each with the server's phases; the hot-tier kernel alone.
set -uo pipefail
. bench/device/gtest.sh
gtest data_plane_gpu_test 90
gtest service_gpu_test 60
gtest cuda_backend_test 60
gtest window_cache_test 60
gtest region_io_test 60
PATHS="${PATHS:-ipc_doorbell:0 shm_doorbell:0 ipc_doorbell:1 shm_doorbell:1 ipc_stream:0 inline_bf16:0}" STEPS=12 \
  bash bench/device/phases.sh
echo "== service_hot_bench"
timeout 120 $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=1 > $OUT/hot_bench.log 2>&1; echo "rc=$?"
grep -A4 "^| tier" $OUT/hot_bench.log | head -6
