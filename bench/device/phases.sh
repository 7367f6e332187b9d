#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# One device call: decode-step benchmark paths against one server, with the
# server's driftkv_attend_phase_seconds scraped around each run.
# SERVER and BENCH name the bundled binaries (defaults driftkv-server-cuda,
# decode_step_bench), SHAPE the model shape, PREFILL_PATH the prefill's path,
# LISTEN the gRPC address (default the config's 127.0.0.1:50051; e.g.
# unix:/tmp/driftkv-grpc.sock).
set -uo pipefail
B=.device/bundle/run
# SERVER_ENV: VAR=value pairs joined by '+' (ab.sh's VARIANTS field).
SERVER_ENV=${SERVER_ENV//+/ }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rm -f /tmp/driftkv-dp.sock
LISTEN=${LISTEN:-127.0.0.1:50051}
env ${SERVER_ENV:-} $B ${SERVER:-driftkv-server-cuda} --config bench/device/${CONF:-dp_server.textproto} \
  --listen $LISTEN >> $OUT/server.log 2>&1 &
S=$!
for i in $(seq 60); do [ -S /tmp/driftkv-dp.sock ] && break; sleep 1; done
sleep 1
scrape() {
  python3 - "$1" <<'PY'
import sys, urllib.request, re
t = urllib.request.urlopen("http://127.0.0.1:9464/metrics").read().decode()
out = open(sys.argv[1], "w")
for line in t.splitlines():
    for m in ("driftkv_attend_phase_seconds", "driftkv_attend_device_seconds"):
        if line.startswith(m + "_sum") or line.startswith(m + "_count"):
            out.write(line + "\n")
PY
}
delta() {
  python3 - "$1" "$2" <<'PY'
import sys, re
def load(p):
    d = {}
    for l in open(p):
        k, v = l.rsplit(" ", 1); d[k] = float(v)
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
for metric, label, title in (("phase", "phase", "server phases"), ("device", "stage", "device stages")):
    n = None; tot = 0; row = []
    keys = [k for k in b if k.startswith(f"driftkv_attend_{metric}_seconds")]
    for k in keys:
        if "_count" in k: n = b[k] - a.get(k, 0)
    if not n: continue
    for k in sorted(keys):
        if "_sum" in k:
            ph = re.search(label + r'="([a-z_]+)"', k).group(1)
            us = (b[k] - a.get(k, 0)) / n * 1e6
            if ph not in ("span", "upload", "merge"): tot += us
            row.append(f"{ph}={us:.1f}")
    print(f"  {title}, mean us over {n:.0f} calls: " + " ".join(row) + f" sum={tot:.1f}")
PY
}
P="--target=$LISTEN ${SHAPE:---layers=32 --sequences=64 --context=8192} --steps=${STEPS:-12} --warmup=3"
BENCH=${BENCH:-decode_step_bench}
# PREFILL_STEPS: the prefill run's own timed steps (default STEPS); each
# adds a token to every sequence, so a long timed run wants a short prefill.
# (The first of a flag counts: the prefill's --steps goes first.)
timeout 300 env ${SERVER_ENV:-} $B $BENCH --steps=${PREFILL_STEPS:-${STEPS:-12}} $P \
  --path=${PREFILL_PATH:-ipc_stream} --prefill=1 2>&1 | tail -1
k=0
for spec in ${PATHS:-shm_doorbell:1 ipc_doorbell:1 shm_doorbell:0 ipc_doorbell:0 ipc_stream:1 inline_bf16:1}; do
  p=${spec%:*}; w=${spec#*:}; k=$((k+1))
  scrape /tmp/m$k.a
  # BENCH_ARGS: more flags for the timed runs; their whole output goes to
  # $OUT/bench.log (e.g. --slow_us's lines).
  timeout ${RUN_TIMEOUT:-120} env ${SERVER_ENV:-} $B $BENCH $P --path=$p --prefill=0 --with_step=$w ${BENCH_ARGS:-} 2>&1 |
    tee -a $OUT/bench.log | tail -1
  scrape /tmp/m$k.b
  delta /tmp/m$k.a /tmp/m$k.b
done
if [ -n "${AFTER:-}" ]; then eval "$AFTER"; fi
kill -TERM $S; wait $S
tail -2 $OUT/server.log
