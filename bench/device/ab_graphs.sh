#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# The GPU tests, then attention launches replayed as CUDA graphs against
# issued one by one (DRIFTKV_CUDA_GRAPHS=0), side by side: a fresh server
# per run (prefill included), alternating, two rounds.
set -uo pipefail
B=.device/bundle/run
gtest() {
  echo "== $1"; timeout $2 $B $1 > $OUT/$1.log 2>&1; echo "rc=$?"; grep -E "PASSED|FAILED|skipped|Failure" $OUT/$1.log | tail -6
}
gtest data_plane_gpu_test 90
gtest cuda_backend_test 60
gtest region_io_test 60
gtest service_gpu_test 60
for round in 1 2; do
  for graphs in 1 0; do
    echo "== round $round, DRIFTKV_CUDA_GRAPHS=$graphs"
    SERVER_ENV="DRIFTKV_CUDA_GRAPHS=$graphs" PATHS="${PATHS:-ipc_doorbell:0 shm_doorbell:0 ipc_doorbell:1 shm_doorbell:1}" \
      STEPS=12 bash bench/device/phases.sh 2>&1 | grep -v "^NVIDIA\|drain"
  done
done
grep -c "replay as one CUDA graph" $OUT/server.log
