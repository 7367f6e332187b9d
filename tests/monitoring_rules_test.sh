#!/usr/bin/env bash
# deploy/monitoring/driftkv-rules.yml: `promtool check rules` and the
# alerts' unit tests, `promtool test rules driftkv-rules.test.yml` (each
# alert fires on the instance that crosses its threshold long enough, not
# before, not on its healthy neighbour; the recording rules' values).
#   monitoring_rules_test.sh RULES RULES_TEST
set -euo pipefail
PROMTOOL="${PROMTOOL:-/usr/bin/promtool}"
command -v "$PROMTOOL" >/dev/null || { echo "FAIL: promtool missing (tools/install_deps.sh installs prometheus)"; exit 1; }
# promtool test rules reads rule_files relative to the test file: copy both.
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
cp "$1" "$TMP/driftkv-rules.yml"
cp "$2" "$TMP/driftkv-rules.test.yml"
"$PROMTOOL" check rules "$TMP/driftkv-rules.yml"
"$PROMTOOL" test rules "$TMP/driftkv-rules.test.yml"
echo PASS
