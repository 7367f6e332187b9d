#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Prefetch (layers promoted together, windows cached) and a decode step's
# window tokens in the staging upload: the GPU tests; the decode-step paths
# against the server before (driftkv-server-cuda-before), two rounds
# alternating; service_hot_bench's first Attend without and with Prefetch;
# Prefetch of 4 sequences of 32 layers x 8K.
set -uo pipefail
. bench/device/gtest.sh
gtest cuda_backend_test 150
gtest service_gpu_test 100
gtest data_plane_gpu_test 80
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" ROUNDS=2 \
  PATHS="${PATHS:-ipc_prepared:0 ipc_prepared:1 shm_prepared:1}" bash bench/device/ab.sh
for p in 0 1; do
  echo "== service_hot_bench --prefetch=$p" | tee -a $OUT/hot_bench.log
  timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=8 --prefetch=$p 2>&1 |
    tee -a $OUT/hot_bench.log | grep -E "^\| (hot|cold)|Attend .* phases|Prefetch calls"
done
echo "== service_hot_bench --prefetch_layers=32 --sequences=4" | tee -a $OUT/hot_bench.log
timeout 120 $B service_hot_bench --prefetch_layers=32 --sequences=4 --context=8192 2>&1 | tee -a $OUT/hot_bench.log | tail -3
