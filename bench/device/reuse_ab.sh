#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Prepared requests that keep their resolved items and sequences between
# calls (service/attend_reuse.h) and inline answers sent from pinned
# staging (service/attend_wire.h), against the build before both (bundled
# as driftkv-server-cuda-before): the GPU tests of the data plane, the
# kernel alone as the service runs it (its window lines), then both
# servers alternating with their device stages timed; then both with 130
# decode steps from a 128-token window, so that every layer seals a page
# (the step's mean and max, not its p50, carry the sealing).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtest data_plane_gpu_test 120
gtest service_gpu_test 120
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=40 --kernel_only_spread=8 2>&1 | tee $OUT/kernel.log | tail -4
VARIANTS="before:driftkv-server-cuda-before:DRIFTKV_DEVICE_TIMING=1 after:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=1" \
  ROUNDS=${ROUNDS:-2} PATHS="${PATHS:-ipc_prepared:0 shm_prepared:0 inline_bf16:0 ipc_prepared:1}" bash bench/device/ab.sh
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" ROUNDS=1 STEPS=130 \
  PATHS="ipc_prepared:1 shm_prepared:1" bash bench/device/ab.sh
