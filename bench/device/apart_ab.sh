#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The client's inline path with the tensors in the caller's memory
# (inline_bf16_apart) against the same call with the tensors inside the
# request message (inline_bf16), alternating within each of ROUNDS (3)
# servers, then the kernel alone for "kernel + X". service_gpu_test first:
# figures of a build that fails its tests are worth nothing.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests service_gpu_test:180 || exit 1
for r in $(seq ${ROUNDS:-3}); do
  echo "== round $r" | tee -a $OUT/ab.log
  SERVER_ENV= CONF=dp_server_poll.textproto BENCH_ARGS="--read_chunk_bytes=1048576 --poll_attend=1" \
    SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell STEPS=${STEPS:-40} \
    PATHS="inline_bf16:0 inline_bf16_apart:0 inline_bf16_apart:0 inline_bf16:0" \
    bash bench/device/phases.sh 2>&1 | cut -c1-400 | tee -a $OUT/ab.log
done
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=30 2>&1 |
  tee $OUT/kernel.log | grep -E "^\| (hot|cold) "
