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
. bench/device/traced_run.sh
one() {
  echo "== round $1: $2 (GRPC_EXPERIMENTS=${EXP[$2]})" | tee -a $OUT/ab.log
  traced_run $2_$1 driftkv-server-cuda inline_bf16 "GRPC_EXPERIMENTS=${EXP[$2]}"
}
rotated ${ROUNDS:-2} one ${DRIFTKV_VARIANTS:-none lowat all}
archive_traces
