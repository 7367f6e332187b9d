#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# An Attend's cold layers promoted together: the service's GPU tests, then
# service_hot_bench, whose first Attend of the hot server promotes 64
# layers of 8K (the build before it: crc_ab.sh's figures).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
gtest service_gpu_test 100
gtest data_plane_gpu_test 80
timeout 120 $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=8 2>&1 | tee $OUT/hot_bench.log | grep -E "^\| (tier|hot|cold)|Attend .* phases"
