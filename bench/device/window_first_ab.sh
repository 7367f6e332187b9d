#!/usr/bin/env bash
# The window's own launch first (LevelMerge::kWindowFirst) against HEAD's
# second launch, one call (bench/device/README.md: bundling):
#   bench/device/make_bundle.sh bench_gpu-head=COMMIT://bench:bench_gpu \
#     bench_gpu-w64=BRANCH://bench:bench_gpu \
#     level_attention_test-w64=BRANCH://kernels:level_attention_test -- \
#     //bench:bench_gpu //kernels:level_attention_test //kernels:attention_test \
#     //backends/cuda:cuda_backend_test //tests:service_gpu_test \
#     //tests:data_plane_gpu_test //bench:service_hot_bench
#   bash bench/device/window_first_ab.sh
# The kernel tests gate each build; bench_gpu of each build in turn with
# SDPA after each run (its columns: in the launch / second launch / window
# first, and the launcher's pick); the service's GPU tests; then
# service_hot_bench (bit-equal answers alone, batched, 8 clients; the
# Handler's p50) until END (560) seconds. Between them, ncu of the two
# window kernels at 64 x 8K.
set -uo pipefail
t0=$SECONDS
GATE_TESTS="level_attention_test:240 attention_test:180" GATED=bench_gpu \
  VARIANTS="${VARIANTS-bench_gpu-head}" GATES="${GATES-bench_gpu-w64=level_attention_test-w64:240}" \
  ROUNDS="${ROUNDS-1 2}" LIMIT=${LIMIT:-300} TAG=k bash bench/device/variants_ab.sh
. bench/device/gtest.sh
# The window's kernels alone (ncu runs kernels one at a time): time,
# instructions, issue rate, registers.
for k in LevelWindowKernel LevelWindowMergeKernel; do
  echo "== ncu $k at 64 x 8K"
  timeout 60 ncu --clock-control none --kernel-name regex:$k --launch-skip 3 --launch-count 1 \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed.avg.per_cycle_active,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $B bench_gpu --encode_tokens=0 --shapes=64x8192 --reps=5 > $OUT/ncu_$k.log 2>&1
  grep -E "gpu__time|inst_executed|registers|dram__|ERR" $OUT/ncu_$k.log | head -6
done
gtests cuda_backend_test:120 service_gpu_test:150 data_plane_gpu_test:150
echo "-- service tests done at $((SECONDS - t0)) s"
left=$((${END:-560} - (SECONDS - t0)))
if [ $left -gt 60 ]; then
  timeout $left $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=8 > $OUT/service_hot_bench.log 2>&1
  echo "rc=$?"
  grep -E "first Attend|^\| (tier|cold|hot) |max \|diff\||alone|Handler|p50" $OUT/service_hot_bench.log | head -24
fi
echo "-- end at $((SECONDS - t0)) s"
cd $OUT && tar czf all_s.tgz *.log 2>/dev/null
rm -f *.log
