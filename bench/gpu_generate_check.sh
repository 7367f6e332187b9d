#!/usr/bin/env bash
# One GPU call: the demo of docs/python.md ("The demo") against
# driftkv-server-cuda. Run on the GPU machine from the repository root,
# with (made here first, kept out of git):
#   .device/bundle   ../shared/tools/bundle-for-device .device/bundle bazel-bin/service/driftkv-server-cuda
#   .device/eval     a copy of ../shared/eval/model (as .device/eval/model)
#   .device/persuasion.txt  the held-out text (python3 -m driftkv.examples.generate writes it to
#                    /tmp/persuasion.txt on its first run here)
#   python/driftkv/_proto/*_pb2*.py  python/gen_stubs.sh
# The model runs with that machine's python3 (torch on CUDA, its grpcio and
# protobuf). OUT names a folder for the server log and the metrics.
set -uo pipefail
B=.device/bundle/run
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$B driftkv-server-cuda --config deploy/driftkv-server.textproto --listen 127.0.0.1:50051 \
  --metrics none --backend cuda > "$OUT/server.log" 2>&1 &
for _ in $(seq 1 150); do grep -q "^listening on port" "$OUT/server.log" && break; sleep 0.2; done
head -2 "$OUT/server.log"
cd python && PYTHONUNBUFFERED=1 python3 -m driftkv.examples.generate --server 127.0.0.1:50051 --device cuda \
  --eval-dir ../.device/eval --persuasion-file ../.device/persuasion.txt --check --json "$OUT/generate.json"
rc=$?
kill -INT %1; wait
exit $rc
