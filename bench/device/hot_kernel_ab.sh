#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The hot-tier attention kernel against the build before it (bundled as
# bench_gpu-before): the kernel tests first, then the bench_gpu builds
# VARIANTS (default "bench_gpu-before bench_gpu", each bundled under that
# name) in turn, ROUNDS (default 2) rounds, with SDPA timed right after
# each run, then ncu's DRAM throughput and issue rate of each kernel at
# 64 x 8K. HOT_ARGS go to the last variant's bench_gpu (a split sweep,
# say); NCU=0 leaves ncu out (for a change that 64 x 8K does not take).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-level_attention_test:180 attention_test:180 cuda_backend_test:300} || exit 1
variants=(${VARIANTS:-bench_gpu-before bench_gpu})
last=${variants[${#variants[@]}-1]}
for round in $(seq ${ROUNDS:-2}); do
  for v in "${variants[@]}"; do
    echo "== round $round: $v"
    args=""
    [ "$v" = "$last" ] && args=${HOT_ARGS:-}
    bench_vs_sdpa $v $round 300 $args
  done
done
[ "${NCU:-1}" = 1 ] || exit 0
for v in "${variants[@]}"; do
  echo "== ncu: $v at 64 x 8K"
  timeout 240 ncu --clock-control none --kernel-name regex:LevelAttentionKernel --launch-skip 3 --launch-count 1 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.per_cycle_active,sm__instruction_throughput.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    $B $v --encode_tokens=0 --shapes=64x8192 --reps=5 > $OUT/ncu_$v.log 2>&1
  grep -E "gpu__time|dram__|sm__inst|smsp__inst|warps_active|==ERR|Error" $OUT/ncu_$v.log | head -10
done
