#!/usr/bin/env bash
# Runs every test: `bazel test //...` (with //python:pytest, the Python
# client's pytest, whose summary is printed), then the codec and service
# tests again under AddressSanitizer + UndefinedBehaviorSanitizer (with a
# 20 s soak for leaks), the service, handler, batcher and client tests under
# ThreadSanitizer, each libFuzzer target for 60 s (fuzz/), then the offline checks of
# deploy/ (tools/deploy_check/run.sh: yamllint, Kubernetes schemas with
# unknown keys refused, Dockerfile lint, dashboard JSON). GPU tests print
# "skipped: no GPU" and pass on machines without one. Ends with the line
# "N passed, N failed" (one count per test target and configuration, and
# per deploy check).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
log=$(mktemp)
run() {  # run LABEL BAZEL-ARGS...
  local label=$1
  shift
  echo "== $label: bazel test $*"
  bazel --batch test "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local p f
  p=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
  f=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log")
  if ((rc != 0 && f == 0)); then
    f=1  # the build itself failed
    echo "== $label: bazel exited with $rc before reporting tests"
  fi
  passed=$((passed + p))
  failed=$((failed + f))
}

run "all tests" //... --test_output=errors
# The Python client's pytest is one of them (//python:pytest); its summary:
pytest_log=bazel-testlogs/python/pytest/test.log
[[ -f "$pytest_log" ]] && echo "== python client (//python:pytest): $(tail -n 1 "$pytest_log")"
run "codec and service tests under ASan+UBSan" --config=asan //tests:codec_tests //tests:asan_service_tests \
  --test_env=SOAK_SECONDS=20 --test_output=errors
run "service, handler, batcher and client tests under ThreadSanitizer" --config=tsan //tests:tsan_tests \
  --test_output=errors
# libFuzzer targets (fuzz/): built with clang, each run 60 s from the
# committed seeds, all at once; one count per target.
echo "== fuzz: fuzz/build.sh, then fuzz/run.sh 60 s per target"
if fuzz/build.sh fuzz/out >"$log" 2>&1; then
  fuzz/run.sh fuzz/out 60 -1 1 "$(mktemp -d)" | tee "$log"
  passed=$((passed + $(grep -cE '^fuzz_[a-z_]+ .* clean$' "$log")))
  failed=$((failed + $(grep -cE '^fuzz_[a-z_]+ .* CRASH' "$log")))
else
  cat "$log"
  echo "== fuzz: the build failed"
  failed=$((failed + 1))
fi
for check in yamllint manifests dockerfile dashboard; do
  if tools/deploy_check/run.sh "$check"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
rm -f "$log"
echo "$passed passed, $failed failed"
((failed == 0))
