#!/usr/bin/env bash
# `driftkv token-hash` prints the tokens_file line of a token: its SHA-256
# (the same as sha256sum's) and the tenant; short tokens and bad tenant
# names are refused. The file it feeds never holds the token.
#   token_hash_cli_test.sh DRIFTKV
set -uo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
cli=$1
token="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
line="$(printf '%s\n' "$token" | "$cli" token-hash --tenant team-a)" || fail "token-hash failed"
want="$(printf %s "$token" | sha256sum | cut -d' ' -f1) team-a"
[[ "$line" == "$want" ]] || fail "got '$line', want '$want'"
grep -q "$token" <<<"$line" && fail "the line holds the token"
out="$(printf 'short' | "$cli" token-hash --tenant team-a 2>&1)" && fail "a 5-byte token was accepted"
grep -q "at least 16" <<<"$out" || fail "unclear message: $out"
out="$(printf '%s' "$token" | "$cli" token-hash --tenant 'a b' 2>&1)" && fail "tenant 'a b' was accepted"
grep -q "tenant" <<<"$out" || fail "unclear message: $out"
echo PASS
