#!/usr/bin/env bash
# One GPU call: the demo of docs/python.md ("The demo") against
# driftkv-server-cuda. Run on the GPU machine from the repository root,
# with (made here first, kept out of git):
#   .device/bundle   ../shared/tools/bundle-for-device .device/bundle bazel-bin/service/driftkv-server-cuda
#   .device/eval     a copy of ../shared/eval/model (as .device/eval/model)
#   .device/persuasion.txt  the held-out text (python/driftkv-generate writes it to
#                    /tmp/persuasion.txt on its first run here)
#   python/driftkv/_proto/*_pb2*.py  python/gen_stubs.sh
# The model runs with that machine's python3 (torch on CUDA, its grpcio and
# protobuf). OUT names a folder for the server log and the metrics.
set -uo pipefail
B=.device/bundle/run
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
source tools/lib/server.sh
server_start "$OUT/server.log" $B driftkv-server-cuda --config deploy/driftkv-server.textproto \
  --listen 127.0.0.1:50051 --metrics none --backend cuda
trap server_stop_all EXIT
server_wait "$SERVER_PID" "$OUT/server.log" 60 || exit 1
head -2 "$OUT/server.log"
PYTHONUNBUFFERED=1 python3 python/driftkv-generate --server 127.0.0.1:50051 --device cuda \
  --eval-dir .device/eval --persuasion-file .device/persuasion.txt --check --json "$OUT/generate.json"
