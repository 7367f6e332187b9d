#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Why the service's attention stage is longer than the kernel alone: the
# GPU tests of the data plane; the kernel alone with pages packed and
# SPREAD apart; then servers timing their device stages, normally and
# isolated (DRIFTKV_DEVICE_TIMING=isolated: the attention launched on an
# idle device, as the kernel alone is timed), alternating; the SM and
# memory clocks sampled every 50 ms throughout ($OUT/clocks.csv).
set -uo pipefail
. bench/device/gtest.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate --format=csv,noheader -lms 50 > $OUT/clocks.csv 2>&1 &
C=$!
mark() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $1" >> $OUT/marks.txt; }
gtest data_plane_gpu_test 120
mark kernel_alone_start
echo "== hot kernel alone, pages packed / spread ${SPREAD:-32}"
timeout 150 $B service_hot_bench --sequences=64 --context=8192 --reps=60 --kernel_only_spread=${SPREAD:-32} 2>&1 | tail -4
mark kernel_alone_end
VARIANTS="${VARIANTS:-timed:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=1 isolated:driftkv-server-cuda:DRIFTKV_DEVICE_TIMING=isolated}" \
  ROUNDS=${ROUNDS:-2} PATHS="${PATHS:-ipc_prepared:0 shm_prepared:0}" bash bench/device/ab.sh
mark servers_end
kill $C
python3 - <<'PY'
import os
rows = [l.split(", ") for l in open(os.environ["OUT"] + "/clocks.csv") if l.count(",") >= 4]
sm = [int(r[1].split()[0]) for r in rows if r[1].split()[0].isdigit()]
if sm: print(f"SM clock MHz over {len(sm)} samples: min {min(sm)} median {sorted(sm)[len(sm)//2]} max {max(sm)}")
PY
cat $OUT/marks.txt
