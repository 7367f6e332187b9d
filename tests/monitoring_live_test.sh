#!/usr/bin/env bash
# A real Prometheus (Debian's, 2.42) on loopback scraping two real
# driftkv-servers under a short workload, with deploy/monitoring's rules
# loaded; then every dashboard panel, variable and rule expression is
# evaluated through Prometheus' HTTP API and must return data
# (tests/monitoring_check.py), and `promtool check metrics` must be clean
# on a live scrape of each server.
#
# The workload (about 15 s): `driftkv bench` against each server and
# `driftkv bench --servers A,B` (ingest, decode steps, hot-tier promotions),
# Attend and Read on unknown sequences (NOT_FOUND), then server B's pool
# filled until an Append is refused (RESOURCE_EXHAUSTED). A third target
# with nothing listening is scraped too. So DriftkvPoolNearlyFull,
# DriftkvHighRejectionRate and DriftkvTargetDown must be pending or firing;
# the other alerts' signals must return data.
#
#   monitoring_live_test.sh SERVER CLI CHECKER DASHBOARD RULES
set -euo pipefail
SERVER="$1" CLI="$2" CHECKER="$3" DASHBOARD="$4" RULES="$5"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
PROMETHEUS="${PROMETHEUS:-/usr/bin/prometheus}"
PROMTOOL="${PROMTOOL:-/usr/bin/promtool}"
for bin in "$PROMETHEUS" "$PROMTOOL" curl; do
  command -v "$bin" >/dev/null || { echo "FAIL: $bin missing (tools/install_deps.sh installs it)"; exit 1; }
done

source "$(dirname "$0")/../tools/lib/server.sh"
pids=()  # Prometheus
cleanup() {
  for p in "${pids[@]}"; do server_stop "$p" TERM 15 || true; done
  server_stop_all
}
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Small shape (2 layers x 2 KV heads x 64; pages of 128 tokens, as the hot
# tier needs, and a window of 32, so 160 tokens make a page), a hot tier of
# a quarter of the pool, and a pool of a few dozen pages so that it fills.
cat >"$TMP/server.textproto" <<'EOF'
model { layers: 2 kv_heads: 2 head_dim: 64 }
codec { name: "dquant" page_tokens: 128 }
window_tokens: 32
pool_bytes: 327680
hot_tier_fraction: 0.25
hot_idle_seconds: 0
max_sequences: 256
EOF

declare -A GRPC METRICS PID
for s in a b; do
  server_start "$TMP/server-$s.log" "$SERVER" --config "$TMP/server.textproto" --listen 127.0.0.1:0 \
    --metrics 127.0.0.1:0
  PID[$s]=$SERVER_PID
done
for s in a b; do
  server_wait "${PID[$s]}" "$TMP/server-$s.log" 60
  GRPC[$s]="127.0.0.1:$SERVER_PORT"
  METRICS[$s]="127.0.0.1:$SERVER_METRICS_PORT"
  echo "server $s: gRPC ${GRPC[$s]}, metrics ${METRICS[$s]}"
done
DEAD="127.0.0.1:$(free_port)"  # nothing listens there: up == 0
PROM_PORT="$(free_port)"
PROM="http://127.0.0.1:$PROM_PORT"

cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $(realpath "$RULES")
scrape_configs:
  - job_name: driftkv
    static_configs:
      - targets: ["${METRICS[a]}", "${METRICS[b]}", "$DEAD"]
EOF
"$PROMTOOL" check config "$TMP/prometheus.yml"
"$PROMETHEUS" --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -sf "$PROM/-/ready" >/dev/null && break
  sleep 0.2
done
curl -sf "$PROM/-/ready" >/dev/null || { echo "prometheus did not start:"; cat "$TMP/prometheus.log"; exit 1; }
echo "prometheus on $PROM"
# The counters need a sample from before the workload for rate() to see it
# move: wait until every target has been scraped twice.
for _ in $(seq 1 100); do
  n="$(curl -sf "$PROM/api/v1/query" --data-urlencode 'query=count(count_over_time(up[1m]) >= 2)' |
    sed -n 's/.*"value":\[[^,]*,"\([0-9]*\)"\].*/\1/p')"
  [[ "$n" == 3 ]] && break
  sleep 0.2
done
[[ "$n" == 3 ]] || { echo "prometheus did not scrape the 3 targets twice"; exit 1; }

echo "== workload"
# Three rounds a couple of scrapes apart, so that rates span several samples.
for round in 1 2 3; do
  for s in a b; do
    "$CLI" --server "${GRPC[$s]}" bench --sequences 2 --tokens 160 --steps 12 --chunk_tokens 64 | tail -n 2
  done
  sleep 2
done
"$CLI" --servers "${GRPC[a]},${GRPC[b]}" bench --sequences 4 --tokens 96 --steps 8 --chunk_tokens 32 | tail -n 4
for s in a b; do
  for _ in $(seq 1 16); do
    ! "$CLI" --server "${GRPC[$s]}" attend --sequence ghost --layer 0 --synthetic 2>/dev/null
  done
  ! "$CLI" --server "${GRPC[$s]}" read --sequence ghost --layer 0 --out_keys /dev/null --out_values /dev/null 2>/dev/null
done
# Fill b's pool: pushes of 160 tokens (a page per layer) until one is refused.
filled=0
for i in $(seq 1 200); do
  if ! out="$("$CLI" --server "${GRPC[b]}" push --sequence "fill-$i" --synthetic --tokens 160 --chunk_tokens 160 2>&1)"; then
    grep -q RESOURCE_EXHAUSTED <<<"$out" || { echo "push failed otherwise: $out"; exit 1; }
    filled=$i
    break
  fi
done
((filled > 0)) || { echo "FAIL: b's pool never filled"; exit 1; }
echo "b's pool full after $((filled - 1)) pushes: $("$CLI" --server "${GRPC[b]}" stats | grep -E 'pages_in_use|capacity_pages' | tr '\n' ' ')"
# A few more Attend calls, so that the last scrapes see traffic too.
"$CLI" --server "${GRPC[a]}" bench --sequences 1 --tokens 160 --steps 4 --chunk_tokens 64 >/dev/null

echo "== promtool check metrics (live scrapes)"
for s in a b; do
  curl -sf "http://${METRICS[$s]}/metrics" >"$TMP/scrape-$s.txt"
  "$PROMTOOL" check metrics <"$TMP/scrape-$s.txt"
  echo "server $s: promtool check metrics clean ($(grep -vc '^#' "$TMP/scrape-$s.txt") samples)"
done

# Let a few scrapes and rule evaluations see the end of the workload.
sleep 6
echo "== every dashboard and rule expression through $PROM"
/usr/bin/python3 "$CHECKER" --prometheus "$PROM" --dashboard "$DASHBOARD" --rules "$RULES" \
  --expect-alerts DriftkvPoolNearlyFull,DriftkvHighRejectionRate,DriftkvTargetDown --rate-interval 1m
echo PASS
