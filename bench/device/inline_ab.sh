#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A/B of the inline path: the server before pinned staging of inline
# tensors (driftkv-server-cuda-before), with it (driftkv-server-cuda), and
# with it plus larger HTTP/2 flow-control windows and frames on both sides
# (driftkv-server-cuda-tune and decode_step_bench-tune with
# DRIFTKV_TUNE=lf, an experimental build), alternating, a fresh server
# each run; 8 layers x 64 sequences x 8192 tokens (the per-layer figures
# are those of 32 layers). The GPU tests first.
set -uo pipefail
. bench/device/gtest.sh
gtest data_plane_gpu_test 90
gtest service_gpu_test 60
for round in 1 2; do
  for v in before staged tune; do
    echo "== round $round: $v"
    case $v in
      before) server=driftkv-server-cuda-before; env= ;;
      staged) server=driftkv-server-cuda; env= ;;
      tune) server=driftkv-server-cuda-tune; env=DRIFTKV_TUNE=lf ;;
    esac
    SERVER=$server BENCH=decode_step_bench-tune SERVER_ENV=$env SHAPE="--layers=8 --sequences=64 --context=8192" \
      PREFILL_PATH=shm_doorbell STEPS=15 PATHS="${PATHS:-inline_bf16:0 inline_bf16:1 ipc_doorbell:0 shm_doorbell:0}" \
      bash bench/device/phases.sh 2>&1 | cut -c1-400
  done
done
