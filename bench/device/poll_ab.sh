#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The inline door, three ways, ROUNDS rounds alternating, a fresh server
# each run (phases.sh, 8 layers x 64 x 8192, inline bf16 without and with
# decode steps): gRPC's sleeping threads (dp_server.textproto); 1 MiB
# socket reads on both sides (dp_server_chunk.textproto,
# --read_chunk_bytes); and those plus the polling door on both sides
# (dp_server_poll.textproto, --poll_attend=1). Then the kernel alone
# (service_hot_bench) for "kernel + X".
set -uo pipefail
. bench/device/gtest.sh
[ -n "${SKIP_TESTS:-}" ] || gtests service_gpu_test:90 || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in $(seq ${ROUNDS:-3}); do
  for v in ${VARIANTS:-sleeping chunk polling}; do
    case $v in
      sleeping) conf=dp_server.textproto; args="" ;;
      chunk) conf=dp_server_chunk.textproto; args="--read_chunk_bytes=1048576" ;;
      polling) conf=dp_server_poll.textproto; args="--read_chunk_bytes=1048576 --poll_attend=1" ;;
    esac
    echo "== round $round: $v" | tee -a $OUT/ab.log
    SERVER_ENV= CONF=$conf BENCH_ARGS="$args" SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell \
      STEPS=${STEPS:-15} PATHS="${PATHS:-inline_bf16:0 inline_bf16:1}" bash bench/device/phases.sh 2>&1 |
      cut -c1-400 | tee -a $OUT/ab.log
  done
done
echo "== service_hot_bench"
timeout 120 $B service_hot_bench --sequences=64 --context=8192 --reps=30 --clients=8 > $OUT/hot_bench.log 2>&1; echo "rc=$?"
grep -A4 "^| tier" $OUT/hot_bench.log; tail -4 $OUT/hot_bench.log
