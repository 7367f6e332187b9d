#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# A/B of server builds on the decode-step benchmark: for each of ROUNDS
# rounds, each VARIANTS entry "name:server-binary[:ENV=value[+ENV=value]]" in turn, a
# fresh server and phases.sh's runs of PATHS against it (SHAPE, default 8
# layers x 64 sequences x 8192 tokens: per-layer figures as in 32-layer
# runs). Each run's output also goes to $OUT/ab.log.
set -uo pipefail
for round in $(seq ${ROUNDS:-2}); do
  for v in $VARIANTS; do
    IFS=: read -r name server env <<< "$v"
    echo "== round $round: $name" | tee -a $OUT/ab.log
    SERVER=$server BENCH=${BENCH:-decode_step_bench} SERVER_ENV=${env:-} \
      SHAPE="${SHAPE:---layers=8 --sequences=64 --context=8192}" PREFILL_PATH=shm_doorbell STEPS=${STEPS:-15} PATHS="$PATHS" \
      bash bench/device/phases.sh 2>&1 | cut -c1-400 | tee -a $OUT/ab.log
  done
done
