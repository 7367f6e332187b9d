#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The GPU tests of a build, then an A/B of the decode-step paths with
# steps against the server of an earlier commit (driftkv-server-cuda-before),
# alternating, a fresh server each run.
set -uo pipefail
. bench/device/gtest.sh
for t in data_plane_gpu_test fork_gpu_test service_gpu_test cuda_backend_test window_cache_test region_io_test encode_test; do gtest $t 120; done
VARIANTS="before:driftkv-server-cuda-before after:driftkv-server-cuda" \
  PATHS="${PATHS:-shm_doorbell:1 ipc_doorbell:1 ipc_doorbell:0 inline_bf16:1}" bash bench/device/ab.sh
