#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Prepared doorbell requests beside plain ones, and the device's stages
# (DRIFTKV_DEVICE_TIMING=1) beside a server that records no events: ROUNDS
# rounds of both servers, alternating, each with phases.sh's runs of PATHS;
# then the hot kernel alone (service_hot_bench).
set -uo pipefail
. bench/device/gtest.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
VARIANTS="${VARIANTS:-timed:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=1 untimed:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=0}" \
  ROUNDS=${ROUNDS:-2} \
  PATHS="${PATHS:-ipc_doorbell:0 ipc_prepared:0 shm_doorbell:0 shm_prepared:0 ipc_doorbell:1 ipc_prepared:1 shm_prepared:1}" \
  bash bench/device/ab.sh
echo "== service_hot_bench"
timeout 120 $B service_hot_bench --sequences=64 --context=8192 --reps=30 --clients=8 > $OUT/hot_bench.log 2>&1; echo "rc=$?"
grep -A4 "^| tier" $OUT/hot_bench.log; tail -4 $OUT/hot_bench.log
