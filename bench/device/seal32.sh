#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The 32-layer decode step over the mean: one server (dp_server.textproto),
# a prefill of 64 x 8192 tokens x 32 layers, then 130 decode steps by the
# CPU client's prepared host-shared-memory path from a 128-token window, so
# that one step seals a page in every layer; then local SDPA on the same
# shape after the server stopped.
set -uo pipefail
B=.device/bundle/run
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rm -f /tmp/driftkv-dp.sock
$B driftkv-server-cuda --config bench/device/dp_server.textproto > $OUT/server.log 2>&1 &
S=$!
for i in $(seq 60); do [ -S /tmp/driftkv-dp.sock ] && break; sleep 1; done
sleep 1
P="--target=127.0.0.1:50051 --layers=32 --sequences=64 --context=8192"
timeout 200 $B decode_step_bench $P --path=shm_doorbell --prefill=1 --with_step=0 --steps=1 --warmup=0 2>&1 | tail -1
timeout 200 $B decode_step_bench $P --path=shm_prepared --prefill=0 --with_step=1 --steps=130 --warmup=3 2>&1 | tail -1 | tee $OUT/seal32.json
kill -TERM $S; wait $S
timeout 200 python3 bench/decode_step_sdpa.py --layers 32 --batch 64 --context 8192 --steps 15 2>&1 | tail -3 | tee $OUT/sdpa.log
