#!/usr/bin/env bash
# GPU checks of one build on nvidia-h200-x2 in one call (docs/nccl.md, "On main"): the GPU tests, drain + warm restart on driftkv-server-cuda, NCCL vs gRPC byte identity, throughput, the killed-client fault, two GPUs vs one. Run from a folder holding ./bundle (bundle-for-device of driftkv-server-cuda, nccl_ingest_bench, cuda_backend_test, service_gpu_test, the three kernels tests and service_drain_test).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")"
B=./bundle/run
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=index,name --format=csv,noheader
t0=$(date +%s)
echo "== GPU unit tests"
for t in attention_test encode_test level_attention_test cuda_backend_test service_gpu_test; do
  $B $t > $OUT/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$t.log | tr '\n' ' ')"
done
echo "== drain + warm restart on driftkv-server-cuda"
DRIFTKV_DRAIN_BACKEND=cuda $B service_drain_test $PWD/bundle/bin/driftkv-server-cuda > $OUT/drain.log 2>&1
echo "service_drain_test (cuda) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/drain.log | tr '\n' ' ')"
echo "tests done in $(( $(date +%s) - t0 )) s"
T=127.0.0.1:50061
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
$B driftkv-server-cuda --config /tmp/nccl_server.textproto --device 1 --listen $T --metrics none > $OUT/server.log 2>&1 &
server=$!
for i in $(seq 1 150); do $B nccl_ingest_bench --target $T --mode stats >/dev/null 2>&1 && break; sleep 0.2; done
head -2 $OUT/server.log
health() {
  python3 - "$T" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary('/grpc.health.v1.Health/Check', request_serializer=lambda x: x, response_deserializer=lambda x: x)
r = check(b'', timeout=5)
print('HEALTH', 'SERVING' if r == b'\x08\x01' else repr(r))
PY
}
echo "== NCCL vs gRPC: byte-identical pages"
$B nccl_ingest_bench --target $T --device 0 --mode equal
echo "== throughput (2 channels)"
$B nccl_ingest_bench --target $T --device 0 --mode throughput --sizes 8,64,1024 --channels 2 --grpc_total_mib 256
echo "== fault: client killed mid-transfer"
before=$($B nccl_ingest_bench --target $T --mode stats | awk '/PAGES/ {print $2}')
$B nccl_ingest_bench --target $T --device 0 --mode fault_child > /tmp/child.log 2>&1 &
child=$!
for i in $(seq 1 300); do grep -q SENT /tmp/child.log && break; sleep 0.05; done
since=$(awk '/SENT/ {print $2}' /tmp/child.log)
kill -9 $child
$B nccl_ingest_bench --target $T --mode fault_watch --since_ns "$since" --before_pages "$before"
health
$B nccl_ingest_bench --target $T --device 0 --mode equal | tail -1
echo "== two GPUs vs one"
T2=127.0.0.1:50062
$B driftkv-server-cuda --config /tmp/nccl_server.textproto --devices 1,0 --listen $T2 --metrics none > $OUT/server2.log 2>&1 &
server2=$!
for i in $(seq 1 150); do $B nccl_ingest_bench --target $T2 --mode stats >/dev/null 2>&1 && break; sleep 0.2; done
for threads in 16 32; do
  $B nccl_ingest_bench --target $T2 --target_one $T --device 0 --mode multi --attend_threads $threads --attend_iters 40 2>&1 | tail -4
done
kill -INT $server2; wait $server2
kill -INT $server; wait $server
echo "all done in $(( $(date +%s) - t0 )) s"
