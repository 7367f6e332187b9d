#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Where the level kernel's window and merge run (kernels/window_merge.cuh):
# the kernels' GPU tests, then `bench_gpu` ROUNDS times (each row: the
# service's choice, forced into the launch, forced into a second launch),
# SDPA after the first, and the service end to end (`service_hot_bench`:
# answers bit-equal alone, batched and under 8 clients).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-level_attention_test:240 cuda_backend_test:300 service_gpu_test:300} || exit 1
for round in $(seq ${ROUNDS:-2}); do
  echo "== bench_gpu, round $round"
  timeout 300 $B bench_gpu --encode_tokens=0 --csv=$OUT/bench_$round.csv > $OUT/bench_$round.log 2>&1; echo "rc=$?"
  grep -A7 "hot ms" $OUT/bench_$round.log
done
timeout 300 python3 bench/sdpa_bench.py --cxx $OUT/bench_1.csv --out $OUT/table.md > $OUT/sdpa.log 2>&1; echo "sdpa rc=$?"
cat $OUT/table.md
echo "== service_hot_bench"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=30 --clients=8 > $OUT/hot_bench.log 2>&1; echo "rc=$?"
grep -A4 "^| tier" $OUT/hot_bench.log | head -5; tail -2 $OUT/hot_bench.log
