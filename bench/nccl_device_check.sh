#!/usr/bin/env bash
# The NCCL ingest checks on a 2-GPU machine (docs/nccl.md), in one call:
# server on GPU 1, client on GPU 0.
#   cd .device/nccl && ./nccl_device_check.sh smoke|quick|full|node|ingest
# with ./bundle made by bundle-for-device from //service:driftkv-server-cuda,
# //bench:nccl_ingest_bench, //backends/cuda:cuda_backend_test and
# //tests:service_gpu_test (node also needs //kernels:attention_test,
# //kernels:encode_test, //kernels:level_attention_test and
# //tests:service_drain_test). smoke: versions, GPUs, the equality check.
# full: the GPU tests, equality, throughput (8, 64, 1024 MiB chunks, NCCL
# vs gRPC), the killed-client fault test, health afterwards, then a second
# server over both GPUs (--devices 1,0) against the first: Attend of
# 64 x 8K bit-equal and items/s. quick: equality, throughput over 2
# channels, the two-GPU check from 16 and 32 client threads. node: every
# GPU test (kernels, backend, service, drain and restore against
# driftkv-server-cuda), then equality, throughput over 2 channels, the
# fault, the two-GPU check from 16 and 32 threads. ingest: equality,
# throughput over 2 and 4 channels, the fault. Writes $OUT/server.log,
# $OUT/server2.log (and each GPU test's log in node mode).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
# tools/lib/server.sh: copied next to this script (docs/nccl.md), or the
# repository's when run from .device/nccl inside a checkout.
here="$(cd "$(dirname "$0")" && pwd)"
for lib in "$here/server.sh" "$here/../../tools/lib/server.sh" "$here/../tools/lib/server.sh"; do
  [[ -f $lib ]] && { source "$lib"; break; }
done
declare -F server_start >/dev/null || { echo "tools/lib/server.sh not found next to $0"; exit 1; }
trap server_stop_all EXIT
mode=${1:-full}
B=./bundle/run
OUT=${OUT:-/tmp}
T=127.0.0.1:50061
T2=127.0.0.1:50062
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
echo "libnccl the binaries load:"
for b in driftkv-server-cuda nccl_ingest_bench; do
  echo "  $b: $(LD_LIBRARY_PATH=bundle/lib ldd bundle/bin/$b | awk '/libnccl/ {print $3}')"
done

gpu_tests() {
  echo "== GPU unit tests"
  for t in attention_test encode_test level_attention_test cuda_backend_test service_gpu_test; do
    $B $t > $OUT/$t.log 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$t.log | tr '\n' ' ')"
  done
  echo "== drain + warm restart on driftkv-server-cuda"
  DRIFTKV_DRAIN_BACKEND=cuda $B service_drain_test $PWD/bundle/bin/driftkv-server-cuda > $OUT/drain.log 2>&1
  echo "service_drain_test (cuda) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/drain.log | tr '\n' ' ')"
  echo "tests done in $(($(date +%s) - t0)) s"
}

wait_for() {  # wait_for PID LOG TARGET: until the server answers
  server_wait "$1" "$2" 60 $B nccl_ingest_bench --target "$3" --mode stats
}

health() {
  python3 - "$T" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary('/grpc.health.v1.Health/Check', request_serializer=lambda x: x, response_deserializer=lambda x: x)
r = check(b'', timeout=5)
print('HEALTH', 'SERVING' if r == b'\x08\x01' else repr(r))
PY
}

throughput() {  # throughput SIZES CHANNELS [EXTRA ARGS]
  local sizes=$1 channels=$2
  shift 2
  $B nccl_ingest_bench --target $T --device 0 --mode throughput --sizes "$sizes" --channels "$channels" "$@"
}

# A client that sends a chunk header and no data, killed with SIGKILL: the
# server must abort the channel by its deadline and keep the pool as it was.
fault() {
  echo "== fault: client killed mid-transfer"
  local before child since
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
}

# Two GPUs: device slot 0 is GPU 1 (NCCL staging there: the client is on
# GPU 0). multi THREADS...: the check from each number of client threads.
multi() {
  echo "== two GPUs vs one"
  server_start $OUT/server2.log $B driftkv-server-cuda --config /tmp/nccl_server.textproto --devices 1,0 \
    --listen $T2 --metrics none
  local server2=$SERVER_PID
  wait_for $server2 $OUT/server2.log $T2
  head -1 $OUT/server2.log
  for threads in "$@"; do
    $B nccl_ingest_bench --target $T2 --target_one $T --device 0 --mode multi --attend_threads $threads \
      --attend_iters 40 | grep MULTI
  done
  server_stop $server2
}

[[ $mode == node ]] && gpu_tests
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
server_start $OUT/server.log $B driftkv-server-cuda --config /tmp/nccl_server.textproto --devices 1 \
  --listen $T --metrics none
server=$SERVER_PID
wait_for $server $OUT/server.log $T
head -3 $OUT/server.log
health
echo "== NCCL vs gRPC: byte-identical pages"
$B nccl_ingest_bench --target $T --device 0 --mode equal
case $mode in
  quick)
    throughput 8,64,1024 2 --grpc_total_mib 256
    multi 16 32
    ;;
  full)
    $B cuda_backend_test 2>&1 | tail -3
    [[ ${GPU_TESTS:-0} == 1 ]] && $B service_gpu_test 2>&1 | tail -3
    throughput 8,64,1024 2
    throughput 8,64,1024 4 --grpc_total_mib 256
    fault
    multi 16
    ;;
  node)
    throughput 8,64,1024 2 --grpc_total_mib 256
    fault
    multi 16 32
    ;;
  ingest)
    throughput 8,64,1024 2 --grpc_total_mib 256
    throughput 64,1024 4 --grpc_total_mib 256
    fault
    ;;
esac
server_stop $server
tail -5 $OUT/server.log
echo "all done in $(($(date +%s) - t0)) s"
