#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Where an inline bf16 Attend's round trip goes: ROUNDS (3) rounds, each of
# a fresh server with DRIFTKV_ATTEND_TRACE (service/call_trace.h) per
# variant, the variants' order rotated each round. A variant is a bundled
# server (SERVERS, default driftkv-server-cuda; e.g. an earlier build
# bundled as driftkv-server-cuda-before for an A/B) and a client path
# (TRACE_PATHS, default the library client inline_bf16 and the tensors
# apart inline_bf16_apart). Each run takes STEPS (100) steps of 8 layers
# x 64 x 8192 without a decode step after a host-shm prefill, the client
# writing its own times (--trace_calls); bench/device/trace_join.py splits
# each run into the way in, the serving (and the call's phases within it)
# and the way out. Then the kernel alone.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
one() {
  local server=$2 path=$3
  local tag=${server#driftkv-server-cuda}_${path}_$1
  tag=${tag#_}
  echo "== round $1: $server $path" | tee -a $OUT/ab.log
  SERVER=$server SERVER_ENV=DRIFTKV_ATTEND_TRACE=$OUT/server_$tag.csv CONF=dp_server_poll.textproto \
    BENCH_ARGS="--read_chunk_bytes=1048576 --poll_attend=1 --trace_calls=$OUT/client_$tag.csv" \
    SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell PREFILL_STEPS=3 \
    STEPS=${STEPS:-100} PATHS="$path:0" \
    bash bench/device/phases.sh 2>&1 | cut -c1-300 | tee -a $OUT/ab.log
  python3 bench/device/trace_join.py $OUT/server_$tag.csv $OUT/client_$tag.csv $tag | tee -a $OUT/ab.log
}
variants=()
for s in ${SERVERS:-driftkv-server-cuda}; do
  for p in ${TRACE_PATHS:-inline_bf16 inline_bf16_apart}; do variants+=("$s $p"); done
done
n=${#variants[@]}
for r in $(seq ${ROUNDS:-3}); do
  for k in $(seq 0 $((n - 1))); do
    one $r ${variants[$(((k + r - 1) % n))]}
  done
done
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=30 2>&1 |
  tee $OUT/kernel.log | grep -E "^\| (hot|cold) "
# The traces travel as one archive (the device returns few files).
(cd $OUT && ls server_*.csv client_*.csv 2>/dev/null | xargs -r tar czf traces.tgz && rm -f server_*.csv client_*.csv)
