#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A/B of glibc malloc settings for driftkv-server-cuda: the same decode-step
# runs with and without GLIBC_TUNABLES (trim and mmap thresholds raised),
# alternating, a fresh server each time.
set -uo pipefail
B=.device/bundle/run
T="glibc.malloc.trim_threshold=536870912:glibc.malloc.mmap_threshold=67108864:glibc.malloc.top_pad=16777216"
P="--target=127.0.0.1:50051 --layers=8 --sequences=64 --context=2048 --steps=15 --warmup=3"
for round in 1 2; do
  for tun in "" "$T"; do
    rm -f /tmp/driftkv-dp.sock
    GLIBC_TUNABLES=$tun $B driftkv-server-cuda --config bench/device/dp_server.textproto > $OUT/server_$round.log 2>&1 &
    S=$!
    for i in $(seq 60); do [ -S /tmp/driftkv-dp.sock ] && break; sleep 0.5; done
    echo "== round $round tunables=${tun:+on}"
    timeout 60 $B decode_step_bench $P --path=shm_doorbell --prefill=1 2>&1 | tail -1 | cut -c1-200
    for p in inline_bf16 ipc_unary shm_stream; do
      timeout 60 $B decode_step_bench $P --path=$p --prefill=0 2>&1 | tail -1 | cut -c1-200
    done
    kill -TERM $S; wait $S
  done
done
