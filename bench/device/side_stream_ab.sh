#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A checked promotion with the cold sums on a second stream, the first
# Attend with a larger client HTTP/2 window, and a sequence's idle layers
# demoted together: the GPU tests, bench_gpu's promotion / demotion /
# checksum lines at 1 x 8K, tier_demotion_bench at 8K x 32 layers on the
# CUDA backend, then service_hot_bench ROUNDS (2) rounds of HOT (default:
# the build before, bundled as service_hot_bench-mid; this one; this one
# with --lookahead_bytes=16777216; `warm`: this one with --warm_channel=1,
# the first Attend on a channel that has carried an answer as large), each
# run started only before HOT_BEFORE seconds (default 480) into the call;
# with INLINE=1 the inline door of poll_ab.sh (one round) if started before
# INLINE_BEFORE (400).
# With bench_gpu-before / -mid bundled, their kernel lines beside this
# build's; with NCU=1, the kernels NCU_REGEX names under ncu last.
set -uo pipefail
. bench/device/gtest.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-level_attention_test:240 page_crc_test:60 cuda_backend_test:120 service_gpu_test:300} || exit 1
# With bench_gpu-before (and bench_gpu-mid) bundled, kernels builds before
# this one, they alternate with it KERNEL_ROUNDS (default 2) times.
kernels=""
for v in bench_gpu-before bench_gpu-mid; do [[ -x .device/bundle/bin/$v ]] && kernels="$kernels $v"; done
kernels="$kernels bench_gpu"
for round in $(seq ${KERNEL_ROUNDS:-2}); do
  for v in $kernels; do
    echo "== round $round, 1 x 8K: $v [$SECONDS s]"
    timeout 90 $B $v --encode_tokens=0 --shapes=1x8192 > $OUT/${v}_$round.log 2>&1
    grep -E "^Promotion|^Demotion|^Checksums" $OUT/${v}_$round.log
  done
done
echo "== demotion with and without cold copies, 8K x 32 layers [$SECONDS s]"
timeout 240 $B tier_demotion_bench --backend=cuda --layers=32 --tokens=8320 --rounds=5 2>&1 |
  tee $OUT/tier_demotion.log | grep -E "^(backend|copies|no copies|demotion)"
for round in $(seq ${ROUNDS:-2}); do
  for v in ${HOT:-mid new lookahead}; do
    [[ $SECONDS -lt ${HOT_BEFORE:-480} ]] || { echo "== skipped $v: $SECONDS s into the call"; continue; }
    case $v in
      mid) cmd="service_hot_bench-mid" ;;
      new) cmd="service_hot_bench" ;;
      lookahead) cmd="service_hot_bench --lookahead_bytes=16777216" ;;
      warm) cmd="service_hot_bench --warm_channel=1" ;;
    esac
    echo "== round $round: $cmd [$SECONDS s]" | tee -a $OUT/hot_bench.log
    timeout 150 $B $cmd --sequences=64 --context=8192 --reps=${REPS:-20} --clients=8 2>&1 | tee -a $OUT/hot_bench.log |
      grep -E "^\| (hot|cold)|Attend .* phases"
  done
done
if [[ -n "${INLINE:-}" && $SECONDS -lt ${INLINE_BEFORE:-400} ]]; then
  SKIP_TESTS=1 ROUNDS=1 VARIANTS="sleeping polling" PATHS="inline_bf16:0" STEPS=40 bash bench/device/poll_ab.sh
fi
# With NCU=1, the kernels NCU_REGEX names (default the demotion kernel),
# each under ncu (one launch: its throughputs, stalls and instructions),
# for each bundled bench_gpu build (NCU_KERNELS picks), while the call has
# time (NCU_BEFORE, 500 s).
if [[ -n "${NCU:-}" ]]; then
  for v in ${NCU_KERNELS:-$kernels}; do
    for k in ${NCU_REGEX:-DemoteKernel}; do
      [[ $SECONDS -lt ${NCU_BEFORE:-500} ]] || { echo "== ncu skipped: $SECONDS s into the call"; break 2; }
      echo "== ncu $k: $v [$SECONDS s]"
      timeout 90 ncu -k regex:$k -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
        .device/bundle/run $v --encode_tokens=0 --shapes=1x8192 > $OUT/ncu_${k}_$v.log 2>&1
      grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Block Limit|Executed Ipc A|Issue Slots|Warp Cycles Per Issued|Executed Instructions  |stalled" \
        $OUT/ncu_${k}_$v.log | head -24
    done
  done
fi
