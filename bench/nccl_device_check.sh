#!/usr/bin/env bash
# The NCCL ingest checks on a 2-GPU machine (docs/nccl.md), in one call:
# server on GPU 1, client on GPU 0.
#   cd .device/nccl && ./nccl_device_check.sh smoke|quick|full
# with ./bundle made by bundle-for-device from //service:driftkv-server-cuda,
# //bench:nccl_ingest_bench, //backends/cuda:cuda_backend_test and
# //tests:service_gpu_test. smoke: versions, GPUs, the equality check.
# full: the GPU tests, equality, throughput (8, 64, 1024 MiB chunks, NCCL
# vs gRPC), the killed-client fault test, health afterwards, then a second
# server over both GPUs (--devices 1,0) against the first: Attend of
# 64 x 8K bit-equal and items/s. quick: equality, throughput over 2
# channels, the two-GPU check from 16 and 32 client threads. Writes
# $OUT/server.log, $OUT/server2.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
mode=${1:-full}
B=./bundle/run
OUT=${OUT:-/tmp}
T=127.0.0.1:50061
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
echo "libnccl the binaries load:"
for b in driftkv-server-cuda nccl_ingest_bench; do
  echo "  $b: $(LD_LIBRARY_PATH=bundle/lib ldd bundle/bin/$b | awk '/libnccl/ {print $3}')"
done
cat > /tmp/nccl_server.textproto <<CFG
backend: "cuda"
model { layers: 32 kv_heads: 8 head_dim: 128 }
pool_bytes: 8589934592
max_message_bytes: 268435456
nccl_max_channels: 8
nccl_chunk_timeout_seconds: 5
nccl_idle_seconds: 600
nccl_max_chunk_bytes: 2147483648
CFG
$B driftkv-server-cuda --config /tmp/nccl_server.textproto --device 1 --listen $T --metrics none \
  > $OUT/server.log 2>&1 &
server=$!
for i in $(seq 1 150); do $B nccl_ingest_bench --target $T --mode stats >/dev/null 2>&1 && break; sleep 0.2; done
head -3 $OUT/server.log
health() {
  python3 - "$T" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary('/grpc.health.v1.Health/Check', request_serializer=lambda x: x, response_deserializer=lambda x: x)
r = check(b'', timeout=5)
print('HEALTH', 'SERVING' if r == b'\x08\x01' else repr(r))
PY
}
health
$B nccl_ingest_bench --target $T --device 0 --mode equal
if [[ $mode == quick ]]; then
  $B nccl_ingest_bench --target $T --device 0 --mode throughput --sizes 8,64,1024 --channels 2 --grpc_total_mib 256
  T2=127.0.0.1:50062
  $B driftkv-server-cuda --config /tmp/nccl_server.textproto --devices 1,0 --listen $T2 --metrics none \
    > $OUT/server2.log 2>&1 &
  server2=$!
  for i in $(seq 1 150); do $B nccl_ingest_bench --target $T2 --mode stats >/dev/null 2>&1 && break; sleep 0.2; done
  for threads in 16 32; do
    $B nccl_ingest_bench --target $T2 --target_one $T --device 0 --mode multi --attend_threads $threads --attend_iters 40 \
      | grep MULTI
  done
  kill -INT $server2
  wait $server2
fi
if [[ $mode == full ]]; then
  $B cuda_backend_test 2>&1 | tail -3
  [[ ${GPU_TESTS:-0} == 1 ]] && $B service_gpu_test 2>&1 | tail -3
  $B nccl_ingest_bench --target $T --device 0 --mode throughput --sizes 8,64,1024 --channels 2
  $B nccl_ingest_bench --target $T --device 0 --mode throughput --sizes 8,64,1024 --channels 4 --grpc_total_mib 256
  before=$($B nccl_ingest_bench --target $T --mode stats | awk '/PAGES/ {print $2}')
  $B nccl_ingest_bench --target $T --device 0 --mode fault_child > /tmp/child.log 2>&1 &
  child=$!
  for i in $(seq 1 300); do grep -q SENT /tmp/child.log && break; sleep 0.05; done
  since=$(awk '/SENT/ {print $2}' /tmp/child.log)
  kill -9 $child
  echo "client killed mid-transfer (header sent, no data)"
  $B nccl_ingest_bench --target $T --mode fault_watch --since_ns "$since" --before_pages "$before"
  health
  echo "after the fault, a new channel:"
  $B nccl_ingest_bench --target $T --device 0 --mode equal | tail -1
  # Two GPUs: device slot 0 is GPU 1 (NCCL staging there: the client is on GPU 0).
  T2=127.0.0.1:50062
  $B driftkv-server-cuda --config /tmp/nccl_server.textproto --devices 1,0 --listen $T2 --metrics none \
    > $OUT/server2.log 2>&1 &
  server2=$!
  for i in $(seq 1 150); do $B nccl_ingest_bench --target $T2 --mode stats >/dev/null 2>&1 && break; sleep 0.2; done
  head -1 $OUT/server2.log
  $B nccl_ingest_bench --target $T2 --target_one $T --device 0 --mode multi --attend_threads 16 --attend_iters 40
  kill -INT $server2
  wait $server2
fi
kill -INT $server
wait $server
tail -5 $OUT/server.log
