#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A/B of the inline path: the server before pinned staging of inline
# tensors (driftkv-server-cuda-before, commit cc5d6c6), with it
# (driftkv-server-cuda), and with it plus larger HTTP/2 flow-control
# windows and frames on both sides (driftkv-server-cuda-tune and
# decode_step_bench-tune with DRIFTKV_TUNE=lf, an experimental build),
# alternating, a fresh server each run. The GPU tests first.
set -uo pipefail
. bench/device/gtest.sh
gtest data_plane_gpu_test 90
gtest service_gpu_test 60
VARIANTS="before:driftkv-server-cuda-before staged:driftkv-server-cuda tune:driftkv-server-cuda-tune:DRIFTKV_TUNE=lf" \
  BENCH=decode_step_bench-tune PATHS="${PATHS:-inline_bf16:0 inline_bf16:1 ipc_doorbell:0 shm_doorbell:0}" \
  bash bench/device/ab.sh
