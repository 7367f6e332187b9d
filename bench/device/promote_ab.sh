#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A build of the kernels against the one before it (bundled as
# bench_gpu-before): the kernels' tests (promotion byte for byte against
# the CPU, attention against float64, batch invariance), then both builds'
# bench_gpu alternating: one round of every shape (hot, cold, promotion,
# demotion), then ROUNDS (default 2) more at 1 x 8K for the promotion and
# demotion lines.
set -uo pipefail
. bench/device/gtest.sh
gtests ${TESTS:-level_attention_test:240 attention_test:240 cuda_backend_test:300} || exit 1
for v in bench_gpu-before bench_gpu; do
  echo "== all shapes: $v"
  timeout 120 $B $v --encode_tokens=0 > $OUT/${v}_all.log 2>&1
  grep -A7 "hot ms" $OUT/${v}_all.log; grep -E "^Promotion|^Demotion" $OUT/${v}_all.log
done
for round in $(seq ${ROUNDS:-2}); do
  for v in bench_gpu-before bench_gpu; do
    echo "== round $round, 1 x 8K: $v"
    timeout 60 $B $v --encode_tokens=0 --shapes=1x8192 > $OUT/${v}_$round.log 2>&1
    grep -E "^Promotion|^Demotion" $OUT/${v}_$round.log
  done
done
