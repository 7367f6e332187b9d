#!/usr/bin/env bash
# The CLI against a real driftkv-server process: starts the server on the
# sample config (port 0: the OS picks, read back from its first lines by
# tools/lib/server.sh), runs a short `driftkv demo`, checks the summary,
# `stats`, `length`, a bad request's exit status, and that SIGTERM stops the
# server cleanly.
set -euo pipefail
SERVER="$1"
CLI="$2"
CONFIG="$3"
LOG="${TEST_TMPDIR:-/tmp}/server.log"
source "$(dirname "$0")/../tools/lib/server.sh"

server_start "$LOG" "$SERVER" --config "$CONFIG" --listen 127.0.0.1:0 --metrics none
PID=$SERVER_PID
trap server_stop_all EXIT
server_wait "$PID" "$LOG" 60
PORT=$SERVER_PORT

OUT="$("$CLI" --server "127.0.0.1:$PORT" demo --tokens 400 --steps 3)"
echo "$OUT"
grep -q "^demo OK$" <<<"$OUT"
grep -Eq "compression vs bf16: [0-9.]+x on compressed pages" <<<"$OUT"

"$CLI" --server "127.0.0.1:$PORT" stats | grep -Eq "capacity_pages: [1-9][0-9]*"
"$CLI" --server "127.0.0.1:$PORT" push --synthetic --tokens 300 --layers 2 --sequence len >/dev/null
LEN="$("$CLI" --server "127.0.0.1:$PORT" length --sequence len)"
echo "$LEN"
grep -q "^layer 1: 300 tokens (128 compressed, 172 in the bf16 window)$" <<<"$LEN"
grep -q "^layer 2: 0 tokens" <<<"$LEN"
if "$CLI" --server "127.0.0.1:$PORT" attend --sequence ghost --layer 0 2>/dev/null; then
  echo "attend on an unknown sequence succeeded"; exit 1
fi

server_stop "$PID" TERM
grep -q "SIGTERM, shutting down" "$LOG"
echo PASS
