#!/usr/bin/env bash
# The CLI's prefix-cache commands against a real driftkv-server: push with
# token ids, lookup (a comma list and a file), fork (from the index and
# from a sequence), pin, a renewal, unpin, and watch, whose lines must name
# the pages by the keys computed here with hashlib from their definition
# (docs/prefix_cache.md, "Page keys"); watch ends after --count events,
# and at SIGINT, with exit status 0.
set -euo pipefail
SERVER="$1"
CLI="$2"
CONFIG="$3"  # 4 layers, page_tokens 128, window_tokens 128
TMP="${TEST_TMPDIR:-/tmp}"
LOG="$TMP/server.log"
source "$(dirname "$0")/../tools/lib/server.sh"

server_start "$LOG" "$SERVER" --config "$CONFIG" --listen 127.0.0.1:0 --metrics none
trap server_stop_all EXIT
server_wait "$SERVER_PID" "$LOG" 60
kv() { "$CLI" --server "127.0.0.1:$SERVER_PORT" "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

# page_keys FIRST LAST: the keys of the full pages of the ids FIRST..LAST,
# one hex key a line.
page_keys() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import hashlib, struct, sys
ids = list(range(int(sys.argv[1]), int(sys.argv[2]) + 1))
key = hashlib.sha256(b"driftkv page key v1").digest()[:16]
for at in range(0, len(ids) - 127, 128):
    key = hashlib.sha256(key + struct.pack("<128I", *ids[at:at + 128])).digest()[:16]
    print(key.hex())
PY
}

# The server subscribes a watch when it runs the call, which the client
# cannot see: store probe pages (one page of layer 0, ids of their own)
# until the watch writing FILE has printed a line.
PROBES=0
probe_until() {
  for _ in $(seq 1 50); do
    PROBES=$((PROBES + 1))
    kv push --sequence "probe$PROBES" --synthetic --tokens 256 --layers 1 \
      --token_ids "$(seq -s, $((PROBES * 100000)) $((PROBES * 100000 + 255)))" >/dev/null
    kv release --sequence "probe$PROBES" >/dev/null
    for _ in 1 2 3 4 5; do
      if [[ -s "$1" ]]; then return 0; fi
      sleep 0.1
    done
  done
  fail "the watch printed nothing"
}

# watch --count 1: one line, then exit 0 by itself.
# (Not through kv: a function in the background is a subshell, and the
# signal must reach the CLI itself.)
"$CLI" --server "127.0.0.1:$SERVER_PORT" watch --count 1 >"$TMP/one.out" 2>"$TMP/one.err" &
ONE=$!
probe_until "$TMP/one.out"
rc=0
wait "$ONE" || rc=$?
[[ $rc == 0 ]] || fail "watch --count 1 exited $rc: $(cat "$TMP/one.err")"
[[ $(wc -l <"$TMP/one.out") == 1 ]] || fail "watch --count 1 printed: $(cat "$TMP/one.out")"
grep -Eq "^stored [0-9a-f]{32} layer 0$" "$TMP/one.out" || fail "watch line: $(cat "$TMP/one.out")"

# A watch until SIGINT, then a prompt of 384 ids pushed into every layer:
# its first 2 pages are sealed (the third stays in the bf16 window).
"$CLI" --server "127.0.0.1:$SERVER_PORT" watch >"$TMP/watch.out" 2>"$TMP/watch.err" &
WATCH=$!
probe_until "$TMP/watch.out"
IDS="$(seq -s, 1001 1384)"
kv push --sequence sys --synthetic --tokens 384 --token_ids "$IDS" >/dev/null
kv release --sequence sys >/dev/null

OUT="$(kv lookup --token_ids "$IDS")"
echo "$OUT"
grep -q "^prompt: 384 tokens, 3 full pages; held in every layer: 2 pages (256 tokens)$" <<<"$OUT"
[[ $(grep -c "^layer [0-3]: 2 pages (256 tokens)$" <<<"$OUT") == 4 ]] || fail "lookup's layers"
grep -q "^miss: page 2 of layer 0: never_stored: page 2 (tokens \[256, 384)) of layer 0 was never stored" <<<"$OUT"
seq 1001 1256 >"$TMP/ids.txt"
kv lookup --token_ids_file "$TMP/ids.txt" | grep -q "^miss: none$"

# fork from the prefix index (the released prompt's pages), then from a
# sequence: both share whole pages and say where to append from.
OUT="$(kv fork --sequence user1 --token_ids "$IDS")"
echo "$OUT"
grep -q "^forked user1 from the prefix index: 256 tokens per layer, 8 pages shared; append from token 256$" <<<"$OUT"
kv fork --sequence user2 --from user1 --fork_tokens 128 |
  grep -q "^forked user2 from user1: 128 tokens per layer, 4 pages shared; append from token 128$"
kv length --sequence user2 | grep -q "128"
if kv fork --sequence user3 --token_ids "$(seq -s, 5001 5256)" 2>"$TMP/fork.err"; then fail "fork of an unknown prompt"; fi
grep -q "^driftkv: NOT_FOUND" "$TMP/fork.err"
kv release --sequence user1 >/dev/null
kv release --sequence user2 >/dev/null

OUT="$(kv pin --pin_id sys --token_ids "$IDS" --ttl_s 60)"
echo "$OUT"
grep -Eq "^pinned sys: 256 tokens per layer, 8 pages, until [0-9-]+T[0-9:]+Z$" <<<"$OUT"
kv pin --pin_id sys --token_ids_file "$TMP/ids.txt" --max_tokens 128 |
  grep -Eq "^pinned sys: 128 tokens per layer, 4 pages, until .*Z \(replaced the live pin of that id\)$"
kv unpin --pin_id sys | grep -q "^unpinned sys: 4 pages$"
if kv unpin --pin_id sys 2>"$TMP/unpin.err"; then fail "a second unpin succeeded"; fi
grep -q "^driftkv: NOT_FOUND: pin_id \"sys\" is not a live pin" "$TMP/unpin.err"
if kv lookup --token_ids 1,x 2>"$TMP/ids.err"; then fail "lookup took a bad id"; fi
grep -q 'item 1 "x" is not a token id' "$TMP/ids.err"

# The watch's lines: both sealed pages of the prompt in each layer.
mapfile -t KEYS < <(page_keys 1001 1384)
[[ ${#KEYS[@]} == 3 ]] || fail "page_keys: ${KEYS[*]}"
for _ in $(seq 1 100); do
  [[ $(grep -c -e "^stored ${KEYS[0]} " -e "^stored ${KEYS[1]} " "$TMP/watch.out") == 8 ]] && break
  sleep 0.1
done
for key in "${KEYS[0]}" "${KEYS[1]}"; do
  for layer in 0 1 2 3; do
    grep -q "^stored $key layer $layer$" "$TMP/watch.out" || fail "no 'stored $key layer $layer': $(cat "$TMP/watch.out")"
  done
done
if grep -q "${KEYS[2]}" "$TMP/watch.out"; then fail "the window's page was reported"; fi
kill -INT "$WATCH"
rc=0
wait "$WATCH" || rc=$?
[[ $rc == 0 ]] || fail "watch exited $rc at SIGINT: $(cat "$TMP/watch.err")"
grep -Eq "^watch: [0-9]+ events, 0 dropped$" "$TMP/watch.err"
echo PASS
