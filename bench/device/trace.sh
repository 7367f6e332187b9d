#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Where an inline bf16 Attend's round trip goes: ROUNDS (3) rounds, each of
# a fresh server with DRIFTKV_ATTEND_TRACE (service/call_trace.h) per
# variant, the variants' order rotated each round. A variant is a bundled
# server (SERVERS, default driftkv-server-cuda; e.g. an earlier build
# bundled as driftkv-server-cuda-before for an A/B) and a client path
# (TRACE_PATHS, default the library client inline_bf16 and the tensors
# apart inline_bf16_apart) and a server config (CONFS, default
# dp_server_poll.textproto; dp_server_poll_long_spin.textproto polls for
# 2 ms after each call, past the gap to a decode loop's next one). Each
# run takes STEPS (100) steps of 8 layers
# x 64 x 8192 without a decode step after a host-shm prefill, the client
# writing its own times (--trace_calls); bench/device/trace_join.py splits
# each run into the way in, the serving (and the call's phases within it)
# and the way out. The kernel alone comes first.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
. bench/device/traced_run.sh
# The traces go into one archive however the script ends (the device
# returns 8 files: a call cut by its timeout left its CSVs behind).
trap archive_traces EXIT
trap 'exit 143' TERM
one() {
  local conf=${4%.textproto}
  conf=${conf#dp_server_poll}  # the default's runs keep their names
  local tag=${2#driftkv-server-cuda}_$3${conf:+_${conf#_}}_$1
  echo "== round $1: $2 $3 $4" | tee -a $OUT/ab.log
  CONF=$4 traced_run ${tag#_} $2 $3
}
variants=()
for s in ${SERVERS:-driftkv-server-cuda}; do
  for p in ${TRACE_PATHS:-inline_bf16 inline_bf16_apart}; do
    for c in ${CONFS:-dp_server_poll.textproto}; do variants+=("$s $p $c"); done
  done
done
# The kernel alone first: a call that runs out of time then loses a traced
# run, not the figure every run is read against.
echo "== kernel alone"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=30 2>&1 |
  tee $OUT/kernel.log | grep -E "^\| (hot|cold) "
rotated ${ROUNDS:-3} one "${variants[@]}"
