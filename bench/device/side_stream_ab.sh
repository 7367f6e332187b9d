#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A checked promotion with the cold sums on a second stream, the first
# Attend with a larger client HTTP/2 window, and a sequence's idle layers
# demoted together: the GPU tests, bench_gpu's promotion / demotion /
# checksum lines at 1 x 8K, tier_demotion_bench at 8K x 32 layers on the
# CUDA backend, then service_hot_bench ROUNDS (2) rounds of HOT (default:
# the build before, bundled as service_hot_bench-mid; this one; this one
# with --lookahead_bytes=16777216), each run started only before
# HOT_BEFORE seconds (default 480) into the call; with INLINE=1 the inline
# door of poll_ab.sh (one round) if started before INLINE_BEFORE (400).
set -uo pipefail
. bench/device/gtest.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-page_crc_test:60 cuda_backend_test:120 service_gpu_test:300} || exit 1
echo "== bench_gpu 1 x 8K"
timeout 90 $B bench_gpu --encode_tokens=0 --shapes=1x8192 > $OUT/bench_gpu.log 2>&1
grep -E "^Promotion|^Demotion|^Checksums" $OUT/bench_gpu.log
echo "== demotion with and without cold copies, 8K x 32 layers"
timeout 240 $B tier_demotion_bench --backend=cuda --layers=32 --tokens=8320 --rounds=5 2>&1 |
  tee $OUT/tier_demotion.log | grep -E "^(backend|copies|no copies|demotion)"
for round in $(seq ${ROUNDS:-2}); do
  for v in ${HOT:-mid new lookahead}; do
    [[ $SECONDS -lt ${HOT_BEFORE:-480} ]] || { echo "== skipped $v: $SECONDS s into the call"; continue; }
    case $v in
      mid) cmd="service_hot_bench-mid" ;;
      new) cmd="service_hot_bench" ;;
      lookahead) cmd="service_hot_bench --lookahead_bytes=16777216" ;;
    esac
    echo "== round $round: $cmd" | tee -a $OUT/hot_bench.log
    timeout 150 $B $cmd --sequences=64 --context=8192 --reps=${REPS:-20} --clients=8 2>&1 | tee -a $OUT/hot_bench.log |
      grep -E "^\| (hot|cold)|Attend .* phases"
  done
done
if [[ -n "${INLINE:-}" && $SECONDS -lt ${INLINE_BEFORE:-400} ]]; then
  SKIP_TESTS=1 ROUNDS=1 VARIANTS="sleeping polling" PATHS="inline_bf16:0" STEPS=40 bash bench/device/poll_ab.sh
fi
