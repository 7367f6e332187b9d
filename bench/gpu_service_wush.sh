#!/usr/bin/env bash
# One GPU call (run on the GPU machine from the repository root; OUT names a
# folder for results). Needs, made on the development machine:
#   .device/bundle   ../shared/tools/bundle-for-device of //kernels:attention_test,
#                    //kernels:encode_test, //kernels:cuda_backend_test,
#                    //bench:bench_gpu, //service:driftkv-server-cuda, //cli:driftkv
#   .device/eval/fixture_public.{k,v,q}.bin   copied from ../shared/eval/
#   .device/wush.xfm a transforms file for the fixture model (4 x 4 x 128),
#                    driftkv-calibrate on calibration text (docs/quality.md)
# Runs: the kernel and backend tests; bench_gpu (fused kernel with and without
# the WUSH stage, bf16 kernel) and SDPA side by side; the fixture through the
# service on the CPU and CUDA backends, Hadamard and WUSH; concurrent decode
# clients against the CUDA backend with and without Attend batching.
# SECTIONS (default "tests bench fixture batching") picks the parts to run.
set -uo pipefail
B=.device/bundle/run
SECTIONS=${SECTIONS:-tests bench fixture batching}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
if on tests; then
echo "== tests"
$B attention_test 2>&1 | tail -3
$B encode_test 2>&1 | grep -E "moved|PASSED|FAILED|Failure" | head -20
$B cuda_backend_test 2>&1 | grep -E "nmse|PASSED|FAILED|Failure|Expected|actual|Which" | head -30
fi
if on bench; then
echo "== bench_gpu"
$B bench_gpu --csv=$OUT/bench.csv > $OUT/bench_gpu.txt 2>&1
tail -25 $OUT/bench_gpu.txt
python3 bench/sdpa_bench.py --cxx $OUT/bench.csv --out $OUT/table.md 2>&1 | tail -12
fi

config() {  # config(backend transform batching) -> path
  local f=$OUT/cfg_$1_$2_$3.textproto
  sed -e "s/^backend: .*/backend: \"$1\"/" -e 's/^pool_bytes: .*/pool_bytes: 2147483648/' deploy/driftkv-server.textproto > $f
  if [ "$2" = wush ]; then
    sed -i -e 's|  # transform: "wush"|  transform: "wush"|' -e 's|  # transforms_file: .*|  transforms_file: ".device/wush.xfm"|' $f
  fi
  [ "$3" = nobatch ] && echo "attend_batching: false" >> $f
  echo $f
}
source tools/lib/server.sh
trap server_stop_all EXIT
serve() {  # serve(config, port): starts the server in the background (SERVER_PID)
  server_start $OUT/server_$2.log $B driftkv-server-cuda --config "$1" --listen 127.0.0.1:$2 \
    --metrics 127.0.0.1:$(( $2 + 1000 ))
  server_wait "$SERVER_PID" $OUT/server_$2.log 60 $B driftkv --server 127.0.0.1:$2 --timeout_s 1 stats
}
port=50100
if on fixture; then
echo "== fixture through the service"
for backend in cpu cuda; do
  for tf in hadamard wush; do
    port=$(( port + 1 ))
    serve "$(config $backend $tf batch)" $port
    echo "-- $backend $tf"
    $B driftkv --server 127.0.0.1:$port fixture --fixture .device/eval/fixture_public --local_check=false 2>&1 | grep -E "layer|all layers|Attend|FAIL|rror"
    $B driftkv --server 127.0.0.1:$port stats 2>&1 | grep -iE "transform|backend|folded" | head -6
    server_stop "$SERVER_PID"
  done
done
fi
if on batching; then
echo "== concurrent decode clients, cuda backend"
for mode in batch nobatch batch; do
  port=$(( port + 1 ))
  serve "$(config cuda hadamard $mode)" $port
  for seqs in 1 8 32 64; do
    echo "-- $mode, $seqs sequences"
    $B driftkv --server 127.0.0.1:$port bench --sequences $seqs --tokens 2048 --steps 64 2>&1 | grep -iE "attend|decode|step" | head -4
  done
  curl -s 127.0.0.1:$(( port + 1000 ))/metrics | grep -E "^driftkv_attend_batch_(calls|items)_(sum|count)"
  server_stop "$SERVER_PID"
done
fi
