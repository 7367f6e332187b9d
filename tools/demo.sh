#!/usr/bin/env bash
# The driftkv demo: builds driftkv-server and the driftkv CLI, starts the
# server on the CPU backend with deploy/driftkv-server.textproto, runs
# `driftkv demo` against it (synthetic multi-layer context pushed, decode
# steps attended and compared with exact attention computed by the client),
# prints the summary and the metrics URL, then stops the server.
#
#   tools/demo.sh [extra `driftkv demo` flags, e.g. --tokens 2048 --steps 64]
#
# Environment: DRIFTKV_PORT (gRPC, default 50051), DRIFTKV_METRICS_PORT
# (default 9464), BAZEL (default bazel; may carry startup options, e.g.
# "bazel --output_base=/tmp/ob"), BAZEL_FLAGS (extra build and info flags).
set -euo pipefail

cd "$(dirname "$0")/.."
tools/install_deps.sh  # the Debian packages it builds with, if missing
BAZEL="${BAZEL:-bazel}"
PORT="${DRIFTKV_PORT:-50051}"
METRICS_PORT="${DRIFTKV_METRICS_PORT:-9464}"

echo "== building driftkv-server and driftkv"
$BAZEL build ${BAZEL_FLAGS:-} //service:driftkv-server //cli:driftkv
BIN="$($BAZEL info ${BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"

source tools/lib/server.sh
LOG="$(mktemp -t driftkv-server.XXXXXX.log)"
echo "== starting driftkv-server on 127.0.0.1:${PORT} (log: ${LOG})"
server_start "$LOG" "$BIN/service/driftkv-server" --config deploy/driftkv-server.textproto \
  --listen "127.0.0.1:${PORT}" --metrics "127.0.0.1:${METRICS_PORT}" --backend cpu
trap server_stop_all EXIT
server_wait "$SERVER_PID" "$LOG" 60 "$BIN/cli/driftkv" --server "127.0.0.1:${PORT}" --timeout_s 1 stats
head -n 2 "$LOG"

echo "== driftkv demo"
"$BIN/cli/driftkv" --server "127.0.0.1:${PORT}" \
  --metrics_url "http://127.0.0.1:${METRICS_PORT}/metrics" demo "$@"

if command -v curl >/dev/null 2>&1; then
  echo "== a few lines of http://127.0.0.1:${METRICS_PORT}/metrics"
  curl -s "http://127.0.0.1:${METRICS_PORT}/metrics" |
    grep -E '^driftkv_(budget_utilization_ratio_(count|sum)|symbols_(coded|moved)_total|pool_(capacity|used)_bytes|pages_encoded_total)' || true
fi
echo "== stopping driftkv-server"
