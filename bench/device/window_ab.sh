#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A decode step's window tokens in the launch's staging upload: the CUDA
# backend's tests, then the decode-step benchmark against the server built
# before (driftkv-server-cuda-before) and after, two rounds alternating
# (phases.sh via ab.sh), with and without the step's new token; then
# service_hot_bench's first Attend.
set -uo pipefail
. bench/device/gtest.sh
gtest cuda_backend_test 150
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" ROUNDS=2 \
  PATHS="${PATHS:-ipc_prepared:0 ipc_prepared:1 shm_prepared:1}" bash bench/device/ab.sh
echo "== service_hot_bench"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=8 > $OUT/hot_bench.log 2>&1
echo "rc=$?"; grep -E "^\| (tier|hot|cold)|Attend .* phases" $OUT/hot_bench.log
