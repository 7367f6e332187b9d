#!/usr/bin/env bash
# --help of every binary lists the binary's own flags (absl's default
# printed "No flags matched" for driftkv-server, whose flags live in
# main.cc; the tools' parser refused --help as an unknown flag).
#   help_test.sh SERVER CLI CODEC CALIBRATE SYNTH
set -uo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() {  # expect PATTERN CMD... : CMD --help prints PATTERN
  local pattern=$1; shift
  local out
  out=$("$@" --help 2>&1)
  grep -q -- "$pattern" <<<"$out" || fail "$* --help lacks '$pattern': $out"
  ! grep -q "No flags matched" <<<"$out" || fail "$* --help: No flags matched"
}
expect "--config" "$1"
expect "--listen" "$1"
expect "--server" "$2"
expect "--sequences" "$2"
expect "--servers" "$2"
expect "--fixture" "$2"
expect "--tls_ca" "$2"
expect "--token_file" "$2"
expect "--token_ids" "$2"
expect "--pin_id" "$2"
expect "driftkv-codec COMMAND --help" "$3"
expect "--k-levels" "$3" encode
expect "--q-heads" "$4"
expect "--kind" "$5"
echo PASS
