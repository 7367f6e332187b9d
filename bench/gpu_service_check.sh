#!/usr/bin/env bash
# One GPU call (run on the GPU machine from the repository root, with
# .device/bundle made by ../shared/tools/bundle-for-device from
# //kernels:attention_test, //kernels:cuda_backend_test,
# //service:driftkv-server-cuda and //cli:driftkv; OUT names a folder for
# the server log): kernel tests, backend test, then the service demo on the
# CUDA backend with the default config (bf16 window up to 255 tokens).
set -uo pipefail
B=.device/bundle/run
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$B attention_test 2>&1 | tail -15
$B cuda_backend_test 2>&1 | tail -6
source tools/lib/server.sh
server_start $OUT/server.log $B driftkv-server-cuda --config deploy/driftkv-server.textproto \
  --listen 127.0.0.1:50051 --metrics 127.0.0.1:9464 --backend cuda
trap server_stop_all EXIT
server_wait "$SERVER_PID" $OUT/server.log 60 $B driftkv --server 127.0.0.1:50051 --timeout_s 1 stats
head -2 $OUT/server.log
$B driftkv --server 127.0.0.1:50051 demo 2>&1 | tail -12
$B driftkv --server 127.0.0.1:50051 bench --sequences 8 --tokens 1024 --steps 32 2>&1 | tail -8
