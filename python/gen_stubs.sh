#!/usr/bin/env bash
# Generates the Python stubs of proto/driftkv.proto with Debian's protoc
# (protobuf-compiler, 3.21) and grpc_python_plugin (protobuf-compiler-grpc):
#   OUT/driftkv/_proto/driftkv_pb2.py, OUT/driftkv/_proto/driftkv_pb2_grpc.py
#
#   python/gen_stubs.sh [OUT]     (OUT defaults to python/, next to the sources)
#
# Debian's python3-grpc-tools (1.14) cannot compile the proto ("Explicit
# 'optional' labels are disallowed"); protoc >= 3.15 can. The proto is
# compiled as driftkv/_proto/driftkv.proto so that the generated service
# module imports its messages as `driftkv._proto.driftkv_pb2` (the wire
# names stay driftkv.v1.*).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="${DRIFTKV_PROTO:-$here/../proto/driftkv.proto}"
out="${1:-$here}"
protoc="${PROTOC:-/usr/bin/protoc}"
plugin="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"
for tool in "$protoc" "$plugin"; do
  [[ -x "$tool" ]] || {
    echo "gen_stubs.sh: $tool not found; apt-get install protobuf-compiler protobuf-compiler-grpc" >&2
    exit 1
  }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/driftkv/_proto" "$out/driftkv/_proto"
cp "$proto" "$tmp/driftkv/_proto/driftkv.proto"
"$protoc" -I"$tmp" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$tmp/driftkv/_proto/driftkv.proto"
