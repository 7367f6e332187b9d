#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Where the IPC path's p99 comes from: prepared CUDA IPC requests without a
# decode step, STEPS (300) steps of 8 layers against each VARIANTS server
# (default after / before, alternating, ROUNDS rounds), every call slower
# than SLOW_US (450: the kernel + 150 us bar) printed with its step, layer
# and time since the first timed call, then how many there were and how
# they spread over the run.
set -uo pipefail
export PYTHONUNBUFFERED=1
for round in $(seq ${ROUNDS:-1}); do
  for v in ${VARIANTS:-after:driftkv-server-cuda before:driftkv-server-cuda-before}; do
    IFS=: read -r name server env <<< "$v"
    echo "== round $round: $name" | tee -a $OUT/stalls.log
    : > $OUT/bench.log
    SERVER=$server SERVER_ENV=${env:-} SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell \
      STEPS=${STEPS:-300} RUN_TIMEOUT=200 BENCH_ARGS="--slow_us=${SLOW_US:-450}" PATHS="ipc_prepared:0" \
      bash bench/device/phases.sh 2>&1 | cut -c1-300 | tee -a $OUT/stalls.log
    grep "slow call" $OUT/bench.log | tee -a $OUT/stalls.log | awk '{print $(NF-1)}' |
      python3 -c "
import sys
t = [float(x) for x in sys.stdin if x.strip()]
print(f'  {len(t)} slow calls; at ms: ' + ', '.join(f'{v:.0f}' for v in t[:40]))
" | tee -a $OUT/stalls.log
  done
done
