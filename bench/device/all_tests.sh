#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Every GPU test binary of the tree (those bundled; TESTS overrides the
# list), then, if all passed, `bench_gpu` with SDPA right after it (the
# latest table of docs/bench_gpu.md) and its promotion and demotion lines.
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gtests ${TESTS:-level_attention_test:240 cuda_backend_test:300 service_gpu_test:300 window_cache_test:120 \
  attention_test:240 data_plane_gpu_test:120 regions_gpu_test:60 region_io_test:60 encode_test:120 \
  page_copy_test:60 page_crc_test:60 launch_plans_test:60 disk_level_gpu_test:120} || exit 1
[ -n "${NO_BENCH:-}" ] && exit 0
echo "== bench_gpu"
timeout 300 $B bench_gpu --encode_tokens=0 ${HOT_ARGS:-} --csv=$OUT/bench.csv > $OUT/bench.log 2>&1; echo "rc=$?"
grep -E "Promotion|Demotion" $OUT/bench.log
timeout 300 python3 bench/sdpa_bench.py --cxx $OUT/bench.csv --out $OUT/table.md > $OUT/sdpa.log 2>&1; echo "sdpa rc=$?"
cat $OUT/table.md
