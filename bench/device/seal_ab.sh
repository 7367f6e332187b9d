#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A decode step's sealing appends encoded together (one EncodePages, one
# checksum pass, one promotion per group) against the build that sealed
# each item alone (bundled as driftkv-server-cuda-before): the GPU tests,
# then both servers alternating at 32 layers x 64 x 8192, 130 decode
# steps from a 128-token window per path (one step seals a page in every
# layer: the step's mean and max carry it), then local SDPA on the same
# shape after the servers stopped.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtest data_plane_gpu_test 120
gtest service_gpu_test 120
gtest cuda_backend_test 180
gtest window_cache_test 180
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" ROUNDS=${ROUNDS:-2} STEPS=130 \
  SHAPE="--layers=32 --sequences=64 --context=8192" PATHS="${PATHS:-shm_prepared:1 ipc_prepared:1}" bash bench/device/ab.sh
timeout 200 python3 bench/decode_step_sdpa.py --layers 32 --batch 64 --context 8192 --steps 15 2>&1 | tail -3 | tee $OUT/sdpa.log
