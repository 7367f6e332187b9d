#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
set -uo pipefail
B=.device/bundle/run
rm -f /tmp/driftkv-dp.sock
$B driftkv-server-cuda --config bench/device/dp_server.textproto > $OUT/server.log 2>&1 &
S=$!
for i in $(seq 60); do [ -S /tmp/driftkv-dp.sock ] && break; sleep 1; done; sleep 1
PYTHONPATH=python timeout 90 python3 python/tests/gpu_check_cuda_tensors.py --target 127.0.0.1:50051 --region-socket /tmp/driftkv-dp.sock > $OUT/gpu_check.json 2> $OUT/gpu_check.err
echo "gpu_check rc=$?"; cat $OUT/gpu_check.json; tail -4 $OUT/gpu_check.err
kill -TERM $S; wait $S
