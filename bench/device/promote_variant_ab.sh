#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The promotion kernel of this build against the build before it
# (bench_gpu-before) and a variant (bench_gpu-lb, gated by its own
# level_attention_test-lb): the kernel and backend tests (TESTS), ROUNDS (3)
# promotion rounds in turn, ncu's instruction count and issue rate of one
# 2048-page launch of each, the SASS profile of this build's
# (sass_counts.sh), then while END (560 s) leaves room bench_gpu with SDPA
# (the cold route) and service_hot_bench (the first Attend).
#   bench/device/make_bundle.sh bench_gpu-before=COMMIT://bench:bench_gpu \
#     bench_gpu-lb=V://bench:bench_gpu level_attention_test-lb=V://kernels:level_attention_test -- \
#     //bench:bench_gpu //kernels:level_attention_test //backends/cuda:cuda_backend_test //bench:service_hot_bench
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
t0=$SECONDS
left() { echo $((${END:-560} - (SECONDS - t0))); }
stamp() { echo "-- $* at $((SECONDS - t0)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-level_attention_test:240 cuda_backend_test:200} || { cd $OUT; tar czf all.tgz *.log; exit 1; }
grep -h "worst error" $OUT/level_attention_test.log
lb=bench_gpu-lb
promotion_gate level_attention_test-lb || lb=''
stamp tests
for round in $(seq ${ROUNDS:-3}); do
  promotion_round $round bench_gpu-before bench_gpu $lb
done
stamp promotion
for v in bench_gpu-before bench_gpu $lb; do
  [ $(left) -lt 60 ] && break
  ncu_promote $v
done
stamp ncu
[ $(left) -gt 200 ] && REPS=3 SKIP=10 KERNEL=PromoteKernel SHAPE=1x8192 timeout 150 bash bench/device/sass_counts.sh
stamp sass
[ $(left) -gt 150 ] && bench_vs_sdpa bench_gpu 1 140
stamp "bench_gpu with SDPA"
if [ $(left) -gt 100 ]; then
  timeout $(($(left) - 5)) $B service_hot_bench --sequences=64 --context=8192 --reps=20 --clients=8 > $OUT/service_hot_bench.log 2>&1
  grep -E "first Attend|^\| (tier|cold|hot) |max \|diff\||alone" $OUT/service_hot_bench.log | head -14
fi
stamp end
cd $OUT && tar czf all.tgz *.log *.md *.csv *.txt 2>/dev/null
rm -f *.log *.md *.csv *.txt
