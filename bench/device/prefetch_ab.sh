#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Prefetch (layers promoted together, windows cached) and a decode step's
# window tokens in the staging upload, most important first: the CUDA
# backend's tests; service_hot_bench with each sequence prefetched before
# the first Attend; Prefetch of 4 sequences of 32 layers x 8K; the
# service's GPU tests; the decode-step paths against the server before
# (driftkv-server-cuda-before), ROUNDS rounds alternating.
set -uo pipefail
. bench/device/gtest.sh
gtest cuda_backend_test 100
gtest window_cache_test 100
echo "== service_hot_bench --prefetch=1" | tee -a $OUT/hot_bench.log
timeout 110 $B service_hot_bench --sequences=64 --context=8192 --reps=10 --clients=4 --prefetch=1 2>&1 |
  tee -a $OUT/hot_bench.log | grep -E "^\| (hot|cold)|Attend .* phases|Prefetch calls"
echo "== service_hot_bench --prefetch_layers=32 --sequences=4" | tee -a $OUT/hot_bench.log
timeout 60 $B service_hot_bench --prefetch_layers=32 --sequences=4 --context=8192 2>&1 | tee -a $OUT/hot_bench.log | tail -2
gtest service_gpu_test 60
gtest data_plane_gpu_test 60
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" ROUNDS=${ROUNDS:-1} \
  PATHS="${PATHS:-ipc_prepared:0 ipc_prepared:1}" bash bench/device/ab.sh
