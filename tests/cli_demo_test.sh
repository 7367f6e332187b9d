#!/usr/bin/env bash
# The CLI against a real driftkv-server process: starts the server on the
# sample config (port 0: the OS picks, read back from its first lines), runs
# a short `driftkv demo`, checks the summary, `stats`, `length`, a bad request's exit
# status, and that SIGTERM stops the server cleanly.
set -euo pipefail
SERVER="$1"
CLI="$2"
CONFIG="$3"
LOG="${TEST_TMPDIR:-/tmp}/server.log"

"$SERVER" --config "$CONFIG" --listen 127.0.0.1:0 --metrics none >"$LOG" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true' EXIT
PORT=""
for _ in $(seq 1 100); do
  PORT="$(sed -n 's/^listening on port \([0-9]*\) (gRPC).*/\1/p' "$LOG")"
  [[ -n "$PORT" ]] && break
  sleep 0.1
done
[[ -n "$PORT" ]] || { echo "server did not start:"; cat "$LOG"; exit 1; }

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

kill -TERM "$PID"
wait "$PID"
grep -q "SIGTERM, shutting down" "$LOG"
echo PASS
