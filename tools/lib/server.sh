# Start, wait for and stop driftkv-server processes from bash: sourced (not
# run) by tools/demo.sh, tools/generate.sh, the sh_tests of tests/ and the
# GPU scripts of bench/. Bazel sh_tests carry it as data
# (//tools:server_sh) and source it from their runfiles.
#
#   server_start LOG BINARY ARGS...   starts BINARY ARGS... >LOG 2>&1 in the
#       background; sets SERVER_PID and remembers it for server_stop_all.
#   server_wait PID LOG [TIMEOUT_S [CHECK...]]   waits (default 60 s) until
#       the server has printed "listening on port N (gRPC)" (and, with
#       CHECK, until the command CHECK... succeeds, e.g. `driftkv stats`);
#       sets SERVER_PORT and SERVER_METRICS_PORT (empty without --metrics).
#       On timeout or an early exit it prints the log and returns 1.
#   server_stop PID [SIGNAL [TIMEOUT_S]]   sends SIGNAL (default INT: the
#       graceful drain of service/main.cc) and waits up to TIMEOUT_S
#       (default 30) before SIGKILL; returns the server's exit status.
#   server_stop_all   server_stop of every server still running (for an EXIT
#       trap: `trap server_stop_all EXIT`).
#
# The log may not exist yet when server_wait starts (the backgrounded shell
# creates it when it gets to run): a missing log reads as empty, never as
# an error under `set -e`.

DRIFTKV_SERVER_PIDS=()

server_start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  DRIFTKV_SERVER_PIDS+=("$SERVER_PID")
}

# The first "listening on port" line of LOG, or nothing.
_server_listening_line() {
  grep -m1 '^listening on port' "$1" 2>/dev/null || true
}

server_wait() {
  local pid=$1 log=$2 timeout=${3:-60}
  shift $(($# < 3 ? $# : 3))
  local deadline=$((SECONDS + timeout)) line=""
  SERVER_PORT="" SERVER_METRICS_PORT=""
  while ((SECONDS < deadline)); do
    line="$(_server_listening_line "$log")"
    if [[ -n "$line" ]] && { (($# == 0)) || "$@" >/dev/null 2>&1; }; then
      SERVER_PORT="$(sed -n 's/^listening on port \([0-9]*\) (gRPC).*/\1/p' <<<"$line")"
      SERVER_METRICS_PORT="$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' <<<"$line")"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "driftkv-server (pid $pid) exited before it was ready; its log ($log):" >&2
      cat "$log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.1
  done
  echo "driftkv-server (pid $pid) not ready within ${timeout} s; its log ($log):" >&2
  cat "$log" >&2 2>/dev/null || true
  return 1
}

server_stop() {
  local pid=$1 signal=${2:-INT} timeout=${3:-30}
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return; }
  kill -"$signal" "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + timeout))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "driftkv-server (pid $pid) still running ${timeout} s after SIG$signal: SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null
}

server_stop_all() {
  local pid
  for pid in "${DRIFTKV_SERVER_PIDS[@]}"; do server_stop "$pid" INT 15 || true; done
}
