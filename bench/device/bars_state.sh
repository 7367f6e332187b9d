#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The bars of the hot-tier and data-plane issues for HEAD's build, with
# promotion variants beside it (VARIANTS, default w8: bench_gpu-V for each
# V, gated by its own level_attention_test-V), in two calls on one warm
# machine:
#   PART=1: the kernel and backend tests of this build, the promotion
#     rounds in turn, bench_gpu with SDPA right after (hot, cold through
#     level pages, device-alone columns), ncu of the attention kernel at
#     64 x 8K (DRAM throughput) and of PromoteKernel in both builds,
#     service_hot_bench (first Attend, bit-equal answers);
#   PART=2: the service's GPU tests, a second bench_gpu round, the inline
#     bf16 trace (trace.sh), PromoteKernel's SASS profile.
#   PART=all: part 1, the service's tests and the trace while time is left.
# Logs end in $OUT/all_$PART.tgz.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)
echo "$gpu"
stamp() { echo "-- $* at $((SECONDS - t0)) s"; }
variants=()
# PART=all: part 1, then what part 2 adds while the call's END (560 s)
# leaves room, for a session that may get one call only.
left() { echo $((${END:-560} - (SECONDS - t0))); }
if [ "${PART:-1}" = 1 ] || [ "${PART:-1}" = all ]; then
  gtests level_attention_test:240 cuda_backend_test:200 || { cd $OUT; tar czf all_1.tgz *.log; exit 1; }
  grep -h "worst error" $OUT/level_attention_test.log
  for v in ${VARIANTS:-w8}; do
    promotion_gate level_attention_test-$v && variants+=(bench_gpu-$v)
  done
  stamp tests
  promotion_round 1 bench_gpu "${variants[@]}"
  promotion_round 2 bench_gpu "${variants[@]}"
  stamp promotion
  bench_vs_sdpa bench_gpu 1 150
  grep -E "^(Promotion|Demotion|cold)" $OUT/bench_gpu_1.log | head -8
  stamp "bench_gpu round 1"
  echo "== ncu LevelAttentionKernel at 64 x 8K"
  timeout 90 ncu --clock-control none --kernel-name regex:LevelAttentionKernel --launch-skip 3 --launch-count 1 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.per_cycle_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    $B bench_gpu --encode_tokens=0 --shapes=64x8192 --reps=5 > $OUT/ncu_attention.log 2>&1
  grep -E "gpu__time|dram__|sm__inst|smsp__inst|warps_active|==ERR|Error" $OUT/ncu_attention.log | head -8
  for v in bench_gpu "${variants[@]}"; do
    [ $(left) -lt 150 ] && break
    ncu_promote $v
  done
  stamp ncu
  # It runs 88-101 s (H100 and H200, 2026-12-07), and a run cut by its
  # timeout leaves no output.
  if [ $(left) -gt 150 ]; then
    timeout 140 $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=8 > $OUT/service_hot_bench.log 2>&1
    grep -E "first Attend|^\| (tier|cold|hot) |max \|diff\||alone" $OUT/service_hot_bench.log | head -14
  fi
fi
if [ "${PART:-1}" = all ]; then
  [ $(left) -gt 160 ] && gtests service_gpu_test:150
  [ $(left) -gt 160 ] && gtests data_plane_gpu_test:150
  stamp "service tests"
  [ $(left) -gt 130 ] && TRACE_PATHS="inline_bf16" ROUNDS=1 STEPS=40 timeout $(($(left) - 10)) bash bench/device/trace.sh
  stamp trace
elif [ "${PART:-1}" = 2 ]; then
  gtests service_gpu_test:150 data_plane_gpu_test:150
  stamp "service tests"
  bench_vs_sdpa bench_gpu 2 150
  stamp "bench_gpu round 2"
  [ $(left) -gt 100 ] && TRACE_PATHS="inline_bf16" ROUNDS=1 STEPS=60 timeout $(left) bash bench/device/trace.sh
  stamp trace
  [ $(left) -gt 100 ] && KERNEL=PromoteKernel SHAPE=1x8192 timeout 100 bash bench/device/sass_counts.sh
fi
stamp end
cd $OUT && tar czf all_${PART:-1}.tgz *.log *.md *.csv *.txt 2>/dev/null
rm -f *.log *.md *.csv *.txt
