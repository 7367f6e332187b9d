#!/usr/bin/env bash
# A real model decoding through driftkv: builds driftkv-server, generates the
# Python stubs, and runs python/driftkv-generate (python/examples/generate.py:
# the eval model, $DRIFTKV_EVAL_DIR/model, default ../shared/eval/model, as
# prefill and decode worker against a driftkv-server on the CPU backend with
# deploy/driftkv-server.textproto, side by side with exact attention;
# docs/python.md, "The demo"). The Python side starts and stops that server
# itself (driftkv.local_server.LocalServer).
#
#   tools/generate.sh [driftkv-generate flags, e.g. --prompts 2 --check]
#   tools/generate.sh --server HOST:PORT ...   # any running server, CUDA included
#
# Installs what it needs when missing: the Debian packages of
# tools/install_deps.sh, python3-torch, and r-cran-janeaustenr (the held-out
# text). Environment: BAZEL (default bazel), BAZEL_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh python3-torch r-cran-janeaustenr
BAZEL="${BAZEL:-bazel}"
if [[ " $* " != *" --server "* ]]; then
  echo "== building driftkv-server" >&2
  $BAZEL build ${BAZEL_FLAGS:-} //service:driftkv-server
  export DRIFTKV_SERVER_BIN="${DRIFTKV_SERVER_BIN:-$($BAZEL info ${BAZEL_FLAGS:-} bazel-bin 2>/dev/null)/service/driftkv-server}"
fi
python/gen_stubs.sh
exec /usr/bin/python3 python/driftkv-generate "$@"
