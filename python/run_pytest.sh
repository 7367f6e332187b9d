#!/usr/bin/env bash
# `bazel test //python:pytest`: the package's tests (python/tests) with
# Debian's /usr/bin/python3 against the driftkv-server given as $1, the
# stubs from //python:stubs. The last line is pytest's summary, e.g.
# "27 passed in 3.21s" (tools/run_tests.sh prints it).
set -euo pipefail
export DRIFTKV_SERVER_BIN="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
export PYTHONPATH="$here:$here/stubs"
export PYTHONDONTWRITEBYTECODE=1
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
cd "$here"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider tests
