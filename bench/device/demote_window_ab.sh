#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Demotion's division-free coding step, the page checksum kernel without
# bank conflicts, and the windows put on the device by a prefill's Append,
# against the build before (bundled as bench_gpu-before and
# service_hot_bench-before) and, for the checksums, a build with the old
# checksum kernel (bench_gpu-mid): the GPU tests, then bench_gpu at
# 1 x 8K (promotion, demotion and the checksums' lines) and
# service_hot_bench (first and second Attend by phase), ROUNDS (default 2)
# rounds alternating.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# PART=kernels or PART=service runs only the tests and bench_gpu, or only
# service_hot_bench (two calls of the device tool's 10 minutes).
if [ "${PART:-kernels}" = kernels ]; then
gtests ${TESTS:-page_crc_test:60 level_attention_test:240 cuda_backend_test:300 service_gpu_test:300} || exit 1
for round in $(seq ${ROUNDS:-2}); do
  for v in bench_gpu-before bench_gpu-mid bench_gpu; do
    echo "== round $round, 1 x 8K: $v"
    timeout 90 $B $v --encode_tokens=0 --shapes=1x8192 > $OUT/${v}_$round.log 2>&1
    grep -E "^Promotion|^Demotion|^Checksums" $OUT/${v}_$round.log
  done
done
# The demotion kernel's SASS (head_dim 128), to count its coding loop.
cuobjdump --dump-sass .device/bundle/bin/bench_gpu 2>/dev/null |
  awk '/Function : /{f = /DemoteKernelILi128/} f' > $OUT/demote128.sass
wc -l $OUT/demote128.sass
fi
[ "${PART:-kernels}" = service ] || exit 0
# The third variant loads every kernel when the context is made
# (CUDA_MODULE_LOADING=EAGER), not at its first launch: what a first
# Attend pays for the modules it is the first to use.
for round in $(seq ${ROUNDS:-2}); do
  for v in service_hot_bench-before service_hot_bench service_hot_bench:eager; do
    echo "== round $round: $v" | tee -a $OUT/hot_bench.log
    mode=LAZY
    [ "${v#*:}" = eager ] && mode=EAGER
    CUDA_MODULE_LOADING=$mode timeout 150 $B ${v%:*} --sequences=64 --context=8192 --reps=20 --clients=8 2>&1 |
      tee -a $OUT/hot_bench.log | grep -E "^\| (hot|cold)|Attend .* phases"
  done
done
