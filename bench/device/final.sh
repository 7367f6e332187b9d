#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The session's final device call, most important first: the data-plane GPU
# test, the decode-step benchmark on every path with the server's phase
# metrics and the Python CUDA-tensor check, local SDPA, the hot-tier service
# bench, the other GPU tests.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
gtest data_plane_gpu_test 90
PATHS="${PATHS:-shm_doorbell:1 ipc_doorbell:1 shm_doorbell:0 ipc_doorbell:0 ipc_stream:0 ipc_stream:1 shm_stream:1 ipc_unary:1 inline_bf16:0 inline_bf16:1}" STEPS=15 \
  AFTER='PYTHONPATH=python timeout 60 python3 python/tests/gpu_check_cuda_tensors.py --target 127.0.0.1:50051 --region-socket /tmp/driftkv-dp.sock > $OUT/gpu_check.json 2> $OUT/gpu_check.err; echo "gpu_check rc=$?"; tail -c 1200 $OUT/gpu_check.json; tail -4 $OUT/gpu_check.err' \
  bash bench/device/phases.sh
echo "== local SDPA"
timeout 90 python3 bench/decode_step_sdpa.py --layers 32 --batch 64 --context 8192 --steps 15 2>&1 | tail -3
echo "== service_hot_bench"
timeout 120 $B service_hot_bench --sequences=64 --context=8192 --reps=30 --clients=8 > $OUT/hot_bench.log 2>&1; echo "rc=$?"
grep -A4 "^| tier" $OUT/hot_bench.log; tail -4 $OUT/hot_bench.log
gtest cuda_backend_test 60
gtest window_cache_test 60
gtest service_gpu_test 60
gtest region_io_test 60
