#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Where an inline bf16 Attend's round trip goes: ROUNDS (3) rounds, each of
# two fresh servers with DRIFTKV_ATTEND_TRACE (service/call_trace.h), one
# timed with the library client (inline_bf16), one with the tensors apart
# (inline_bf16_apart), their order swapped each round; each takes STEPS
# (100) steps of 8 layers x 64 x 8192 without a decode step after a
# host-shm prefill, the client writing its own times (--trace_calls);
# bench/device/trace_join.py splits each run into the way in, the serving
# and the way out. Then the kernel alone.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
one() {
  local tag=$2_$1
  echo "== round $1: $2" | tee -a $OUT/ab.log
  SERVER_ENV=DRIFTKV_ATTEND_TRACE=$OUT/server_$tag.csv CONF=dp_server_poll.textproto \
    BENCH_ARGS="--read_chunk_bytes=1048576 --poll_attend=1 --trace_calls=$OUT/client_$tag.csv" \
    SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell PREFILL_STEPS=3 \
    STEPS=${STEPS:-100} PATHS="$2:0" \
    bash bench/device/phases.sh 2>&1 | cut -c1-300 | tee -a $OUT/ab.log
  python3 bench/device/trace_join.py $OUT/server_$tag.csv $OUT/client_$tag.csv $tag | tee -a $OUT/ab.log
}
for r in $(seq ${ROUNDS:-3}); do
  if ((r % 2)); then
    one $r inline_bf16; one $r inline_bf16_apart
  else
    one $r inline_bf16_apart; one $r inline_bf16
  fi
done
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=30 2>&1 |
  tee $OUT/kernel.log | grep -E "^\| (hot|cold) "
# The traces travel as one archive (the device returns few files).
(cd $OUT && ls server_*.csv client_*.csv 2>/dev/null | xargs -r tar czf traces.tgz && rm -f server_*.csv client_*.csv)
