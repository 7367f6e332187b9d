#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Inline bf16 Attend over gRPC on TCP loopback against the same over a Unix
# domain socket: ROUNDS (4) rounds of two fresh servers, one per transport,
# their order swapped each round; each server takes two runs of STEPS (100)
# steps of 8 layers x 64 x 8192 without a decode step after a host-shm
# prefill. Then the kernel alone for "kernel + X".
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
one() {
  echo "== round $1: $2" | tee -a $OUT/ab.log
  SERVER_ENV= LISTEN=$2 CONF=dp_server_poll.textproto \
    BENCH_ARGS="--read_chunk_bytes=1048576 --poll_attend=1" \
    SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell PREFILL_STEPS=3 \
    STEPS=${STEPS:-100} PATHS="inline_bf16:0 inline_bf16:0" \
    bash bench/device/phases.sh 2>&1 | cut -c1-300 | tee -a $OUT/ab.log
  rm -f /tmp/driftkv-grpc.sock
}
for r in $(seq ${ROUNDS:-4}); do
  if ((r % 2)); then
    one $r 127.0.0.1:50051; one $r unix:/tmp/driftkv-grpc.sock
  else
    one $r unix:/tmp/driftkv-grpc.sock; one $r 127.0.0.1:50051
  fi
done
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=30 2>&1 |
  tee $OUT/kernel.log | grep -E "^\| (hot|cold) "
