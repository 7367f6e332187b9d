#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# gRPC's own experiments (the GRPC_EXPERIMENTS environment variable of gRPC
# 1.51: tcp_rcv_lowat, tcp_frame_size_tuning, peer_state_based_framing,
# flow_control_fixes) on the inline bf16 Attend's bytes:
#  1. the bare door (grpc_door_bench: 0.5 MiB each way, 1 MiB reads),
#     polling both sides and sleeping both sides, DOOR_ROUNDS (2) rounds of
#     every variant in turn;
#  2. through driftkv, ROUNDS (2) rounds of a fresh server per variant in
#     DRIFTKV_VARIANTS (server and client with the same experiments; the
#     order rotated each round), 8 layers x 64 x 8192 inline bf16 without a
#     decode step on the polling door (CONF=dp_server_chunk.textproto
#     POLL=0: the sleeping door, both with 1 MiB reads), each run traced as
#     trace.sh does.
# The traces travel as one archive (traces.tgz).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nproc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
declare -A EXP=(
  [none]=""
  [lowat]="tcp_rcv_lowat"
  [tuning]="tcp_frame_size_tuning,tcp_rcv_lowat"
  [all]="tcp_frame_size_tuning,tcp_rcv_lowat,peer_state_based_framing,flow_control_fixes"
)
DOOR=(${DOOR_VARIANTS:-none lowat tuning all})
for r in $(seq ${DOOR_ROUNDS:-2}); do
  echo "== door round $r" | tee -a $OUT/ab.log
  for v in "${DOOR[@]}"; do
    for mode in "1 1" "0 0"; do
      line=$(env GRPC_EXPERIMENTS=${EXP[$v]} PAYLOAD=1 CHUNK=1 timeout 60 $B grpc_door_bench $mode 2>&1 | tail -1)
      echo "$v: $line" | tee -a $OUT/ab.log
    done
  done
done
one() {
  local tag=$2_$1
  echo "== round $1: $2 (GRPC_EXPERIMENTS=${EXP[$2]})" | tee -a $OUT/ab.log
  SERVER_ENV="GRPC_EXPERIMENTS=${EXP[$2]}+DRIFTKV_ATTEND_TRACE=$OUT/server_$tag.csv" CONF=${CONF:-dp_server_poll.textproto} \
    BENCH_ARGS="--read_chunk_bytes=1048576 --poll_attend=${POLL:-1} --trace_calls=$OUT/client_$tag.csv" \
    SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell PREFILL_STEPS=3 \
    STEPS=${STEPS:-100} PATHS="inline_bf16:0" \
    bash bench/device/phases.sh 2>&1 | cut -c1-300 | tee -a $OUT/ab.log
  # (The sleeping door keeps no trace: only the polling door's threads do.)
  [ -f $OUT/server_$tag.csv ] &&
    python3 bench/device/trace_join.py $OUT/server_$tag.csv $OUT/client_$tag.csv $tag | tee -a $OUT/ab.log
}
VARS=(${DRIFTKV_VARIANTS:-none lowat all})
n=${#VARS[@]}
for r in $(seq ${ROUNDS:-2}); do
  for k in $(seq 0 $((n - 1))); do
    one $r ${VARS[$(((k + r - 1) % n))]}
  done
done
(cd $OUT && ls server_*.csv client_*.csv 2>/dev/null | xargs -r tar czf traces.tgz && rm -f server_*.csv client_*.csv)
