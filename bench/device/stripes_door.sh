#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The bare gRPC door (grpc_door_bench, no driftkv) with a 64-item,
# 0.5 MiB-each-way Attend sent whole or striped over 2, 4 and 8
# connections at once, blocking client threads (BLOCK=1) or spinning
# ones, with and without 1 MiB socket reads; ROUNDS rounds alternating.
set -uo pipefail
B=.device/bundle/run
nproc
for round in $(seq ${ROUNDS:-2}); do
  echo "== round $round"
  for v in 1 2 4 8 4spin 1chunk 4chunk; do
    env=(PAYLOAD=1 BLOCK=1)
    case $v in
      1) ;;
      4spin) env=(PAYLOAD=1 STRIPES=4) ;;
      1chunk) env+=(CHUNK=1) ;;
      4chunk) env+=(STRIPES=4 CHUNK=1) ;;
      *) env+=(STRIPES=$v) ;;
    esac
    env "${env[@]}" timeout 60 $B grpc_door_bench 0 0 2>&1 | tail -1
  done
done
