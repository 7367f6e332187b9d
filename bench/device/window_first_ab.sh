#!/usr/bin/env bash
# The bf16 window in its own launch before the pages' (LevelMerge::
# kWindowFirst) against the second launch: measured on 2026-12-08 and not
# kept (docs/hot_tier.md, "The window and the merge"; its code is
# docs/hot_tier/window_first_2026-12-07.patch, the branches below local to
# the VM that built them). Builds (bench/device/README.md: bundling):
#   bench/device/make_bundle.sh \
#     bench_gpu-w64=window-first-w64://bench:bench_gpu \
#     level_attention_test-w64=window-first-w64://kernels:level_attention_test \
#     bench_gpu-pf=wf-prefetch://bench:bench_gpu \
#     level_attention_test-pf=wf-prefetch://kernels:level_attention_test \
#     bench_gpu-w64pf=wf-w64-prefetch://bench:bench_gpu \
#     level_attention_test-w64pf=wf-w64-prefetch://kernels:level_attention_test \
#     cuda_backend_test-wf=window-first-auto://backends/cuda:cuda_backend_test \
#     service_gpu_test-wf=window-first-auto://tests:service_gpu_test \
#     service_hot_bench-wf=window-first-auto://bench:service_hot_bench \
#     cuda_backend_test-ds=deferred-sums://backends/cuda:cuda_backend_test \
#     service_gpu_test-ds=deferred-sums://tests:service_gpu_test \
#     service_hot_bench-ds=deferred-sums://bench:service_hot_bench -- \
#     //bench:bench_gpu //kernels:level_attention_test //kernels:attention_test
#   bash bench/device/window_first_ab.sh                 # call 1: the kernels
#   PART=service bash bench/device/window_first_ab.sh    # call 2, warm machine
# Branches: window-first-auto is main with kAuto taking the window first for
# grids of more than one wave; window-first-w64 that, with the window kernel
# bounded to 64 registers; wf-prefetch window-first-auto with every window
# row prefetched to L2 at the window block's start; wf-w64-prefetch both.
# PART=kernels: the kernel tests gate each build; bench_gpu of each build in
# turn, SDPA after each run (columns: in the launch / second launch / window
# first, and the launcher's pick: the window first in the variants, the
# second launch in main); ncu of the two window kernels at 64 x 8K.
# PART=service: for each of SERVICE_BUILDS (wf: the window first;
# ds: deferred-sums, the first Attend's level sums on a second stream),
# the service's GPU tests, then each build's service_hot_bench in turn
# (bit-equal answers alone, batched, 8 clients; the first Attend against
# a later one; the Handler's p50) until END (560) seconds.
set -uo pipefail
t0=$SECONDS
if [ "${PART:-kernels}" = kernels ]; then
  # (VARIANTS " ": no build measured unless gated; variants_ab.sh's default is bench_gpu.)
  GATE_TESTS="level_attention_test:240 attention_test:180" GATED=bench_gpu VARIANTS="${VARIANTS- }" \
    GATES="${GATES-bench_gpu-w64=level_attention_test-w64:240 bench_gpu-pf=level_attention_test-pf:240 bench_gpu-w64pf=level_attention_test-w64pf:240}" \
    ROUNDS="${ROUNDS-1 2}" LIMIT=${LIMIT:-450} TAG=k bash bench/device/variants_ab.sh
  . bench/device/gtest.sh
  # The window's kernels alone (ncu runs kernels one at a time): time,
  # instructions, issue rate, registers.
  for k in LevelWindowKernel LevelWindowMergeKernel; do
    [ $((SECONDS - t0)) -gt ${END:-560} ] && break
    echo "== ncu $k at 64 x 8K"
    timeout 60 ncu --clock-control none --kernel-name regex:$k --launch-skip 3 --launch-count 1 \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed.avg.per_cycle_active,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      $B bench_gpu --encode_tokens=0 --shapes=64x8192 --reps=5 > $OUT/ncu_$k.log 2>&1
    grep -E "gpu__time|inst_executed|registers|dram__|ERR" $OUT/ncu_$k.log | head -6
  done
else
  . bench/device/gtest.sh
  ok=""
  for b in ${SERVICE_BUILDS:-wf ds}; do
    gtests cuda_backend_test-$b:120 service_gpu_test-$b:150 && ok="$ok $b"
  done
  echo "-- service tests done at $((SECONDS - t0)) s; measured:$ok"
  for b in $ok; do
    left=$((${END:-560} - (SECONDS - t0)))
    [ $left -gt 60 ] || break
    echo "== service_hot_bench-$b at $((SECONDS - t0)) s"
    timeout $left $B service_hot_bench-$b --sequences=64 --context=8192 --reps=20 --clients=8 \
      > $OUT/service_hot_bench-$b.log 2>&1
    echo "rc=$?"
    grep -E "first Attend|second Attend|^\| (tier|cold|hot) |max \|diff\||alone|Handler|p50" $OUT/service_hot_bench-$b.log | head -24
  done
fi
echo "-- end at $((SECONDS - t0)) s"
cd $OUT && tar czf all_${PART:-kernels}.tgz *.log 2>/dev/null
rm -f *.log
