#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# bench_gpu builds side by side, with the kernel tests of a branch as the
# gate of its own build, sized to what device time is left:
#   GATE_TESTS (level_attention_test-q:240 attention_test-q:180; empty:
#     none, as in a second call on the same machine) gate GATED
#     (bench_gpu-q), a build that joins the variants only if they pass;
#   GATES ("BUILD=TEST:SECONDS[,TEST:SECONDS...] ..."): more builds, each
#     joining the variants only if its own tests pass;
#   VARIANTS (bench_gpu): the builds measured, each bundled under its name;
#   ROUNDS ("1"; empty: none): the rounds' numbers, variants in turn, SDPA
#     right after each run; a run starts only before LIMIT (300) seconds;
#   SERVICE=1: then the service's GPU tests and one inline bf16 trace
#     (trace.sh) until END (570) seconds; NCU=1: ncu's DRAM throughput and
#     issue rate of bench_gpu and NCU_OTHER at 64 x 8K.
# Logs end in $OUT/all_$TAG.tgz (the device returns a few files).
# The splits' A/B of 2026-12-07 (docs/bench_gpu.md), two calls:
#   VARIANTS="bench_gpu bench_gpu-s16 bench_gpu-c16 bench_gpu-f16 bench_gpu-wpad" \
#     LIMIT=190 bash bench/device/variants_ab.sh
#   GATE_TESTS= ROUNDS="2 3" TAG=b VARIANTS="bench_gpu-f16 bench_gpu bench_gpu-q \
#     bench_gpu-s16 bench_gpu-c16 bench_gpu-wpad" bash bench/device/variants_ab.sh
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
variants=${VARIANTS:-bench_gpu}
gate=${GATE_TESTS-level_attention_test-q:240 attention_test-q:180}
if [ -n "$gate" ]; then
  gtests $gate && variants="$variants ${GATED:-bench_gpu-q}"
  for t in $gate; do
    grep -hE "^\[       OK|FAILED|worst error|Failure|Expected|Which is" $OUT/${t%:*}.log | head -30
  done
  echo "kernel tests done at $((SECONDS - t0)) s"
fi
for g in ${GATES:-}; do
  tests=${g#*=}
  gtests ${tests//,/ } && variants="$variants ${g%%=*}"
  for t in ${tests//,/ }; do
    grep -hE "^\[       OK|FAILED|worst error|Failure|Expected|Which is" $OUT/${t%:*}.log | head -30
  done
  echo "${g%%=*}'s tests done at $((SECONDS - t0)) s"
done
echo "$variants" > $OUT/variants.txt
for round in ${ROUNDS-1}; do
  for v in $variants; do
    [ $((SECONDS - t0)) -gt ${LIMIT:-300} ] && { echo "time: round $round $v skipped"; continue; }
    echo "== round $round: $v at $((SECONDS - t0)) s"
    bench_vs_sdpa $v $round 150
  done
done
if [ "${SERVICE:-0}" = 1 ]; then
  gtests cuda_backend_test:120 service_gpu_test:150 data_plane_gpu_test:150
  echo "service tests done at $((SECONDS - t0)) s"
  left=$((${END:-570} - (SECONDS - t0)))
  [ $left -gt 100 ] && TRACE_PATHS="inline_bf16" ROUNDS=1 STEPS=60 timeout $left bash bench/device/trace.sh
fi
if [ "${NCU:-0}" = 1 ]; then
  for v in bench_gpu ${NCU_OTHER:-}; do
    [ $((SECONDS - t0)) -gt $((${END:-570} - 50)) ] && break
    echo "== ncu: $v at 64 x 8K ($((SECONDS - t0)) s)"
    timeout 60 ncu --clock-control none --kernel-name regex:LevelAttentionKernel --launch-skip 3 --launch-count 1 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.per_cycle_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      $B $v --encode_tokens=0 --shapes=64x8192 --reps=5 > $OUT/ncu_$v.log 2>&1
    grep -E "gpu__time|dram__|sm__inst|smsp__inst|warps_active|==ERR|Error" $OUT/ncu_$v.log | head -10
  done
fi
echo "end at $((SECONDS - t0)) s"
cd $OUT && tar czf all_${TAG:-a}.tgz *.log *.md *.csv *.txt 2>/dev/null
rm -f *.log *.md *.csv *.txt
