#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The promotion against the build before it (bundled as bench_gpu-before,
# service_hot_bench-before) and a variant (bench_gpu-w8 with its
# level_attention_test-w8; skipped when its tests fail): the kernel and
# backend tests, promotion rounds in turn, ncu of PromoteKernel, its SASS
# profile (sass_counts.sh), bench_vs_sdpa, service_hot_bench. The plan of
# docs/hot_tier.md "A multiply-high decode step"; the bundle as the log
# docs/hot_tier/promote_umulhi_h100_2026-12-07.log says (a variant: any
# build bundled under bench_gpu-w8).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader); echo "$gpu"
gtests level_attention_test:240 cuda_backend_test:200 || { cd $OUT; tar czf all.tgz *.log; exit 1; }
grep -h "worst error" $OUT/level_attention_test.log
w8=bench_gpu-w8
promotion_gate level_attention_test-w8 || w8=''
echo "tests done at $((SECONDS - t0)) s"
for round in 1 2; do
  promotion_round $round bench_gpu-before bench_gpu $w8
done
echo "promotion rounds done at $((SECONDS - t0)) s"
for v in bench_gpu; do
  echo "== ncu PromoteKernel: $v"
  timeout 120 ncu --clock-control none --kernel-name regex:PromoteKernel --launch-count 60 \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed.avg.per_cycle_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio \
    $B $v --encode_tokens=0 --shapes=1x8192 --reps=3 > $OUT/ncu_$v.log 2>&1
  grep -A14 "(2048, 2, 1)" $OUT/ncu_$v.log | head -15
done
echo "ncu done at $((SECONDS - t0)) s"
KERNEL=PromoteKernel SHAPE=1x8192 timeout 150 bash bench/device/sass_counts.sh
echo "sass done at $((SECONDS - t0)) s"
echo "== all shapes with SDPA: bench_gpu at $((SECONDS - t0)) s"
bench_vs_sdpa bench_gpu 1 150
if echo "$gpu" | grep -q H200; then
  timeout 120 ncu --clock-control none -k regex:LevelAttention --launch-skip 3 -c 1 --section SpeedOfLight \
    $B bench_gpu --shapes=64x8192 --reps=5 --encode_tokens=0 2>&1 | grep -E "Duration|DRAM Throughput|Memory Throughput"
fi
for v in service_hot_bench; do
  [ $((SECONDS - t0)) -gt 190 ] && { echo "time: $v skipped"; continue; }
  echo "== $v at $((SECONDS - t0)) s"
  timeout 110 $B $v --sequences=64 --context=8192 --reps=20 --clients=8 > $OUT/$v.log 2>&1
  grep -E "first Attend|^\| (tier|cold|hot) |max \|diff\||alone" $OUT/$v.log | head -14
done
echo "done at $((SECONDS - t0)) s"
cd $OUT && tar czf all.tgz *.log *.md *.csv *.txt 2>/dev/null; ls $OUT | wc -l
