#!/usr/bin/env bash
# Runs every test: `bazel test //...` with -Werror on our sources
# (--config=ci; with //python:pytest, the Python client's pytest, whose
# summary is printed), then the codec and service tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer (clang, the objects the
# fuzz targets then reuse; with a 20 s soak for leaks), the service,
# handler, batcher and client tests under
# ThreadSanitizer, each libFuzzer target for 60 s (bazel build
# --config=fuzz //fuzz/..., fuzz/run.sh), the offline checks of deploy/
# (tools/deploy_check/run.sh: yamllint, Kubernetes schemas with unknown keys
# refused, Dockerfile lint, dashboard JSON) and the format check
# (tools/format.sh --check). GPU tests print "skipped: no GPU" and pass on
# machines without one. Ends with the line "N passed, N failed" (one count
# per test target and configuration, per fuzz target, per deploy check, one
# for the TSan tests' static link and one for the format).
#
#   tools/run_tests.sh [PART...]   PART: all asan tsan fuzz deploy format
#                                  (default: every part, in that order)
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

check() {  # check LABEL COMMAND...: one count
  local label=$1
  shift
  echo "== $label: $*"
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "== $label: failed"; fi
}

part_all() {
  run "all tests" --config=ci //... --test_output=errors
  # The Python client's pytest is one of them (//python:pytest); its summary:
  local pytest_log=bazel-testlogs/python/pytest/test.log
  [[ -f "$pytest_log" ]] && echo "== python client (//python:pytest): $(tail -n 1 "$pytest_log")"
}

part_asan() {
  run "codec and service tests under ASan+UBSan" --config=asan //tests:codec_tests //tests:asan_service_tests \
    --test_env=SOAK_SECONDS=20 --test_output=errors
}

part_tsan() {
  check "tsan tests linked statically (//third_party/tsan's suppressions apply)" tsan_tests_static
  run "service, handler, batcher and client tests under ThreadSanitizer" --config=tsan //tests:tsan_tests \
    --test_output=errors
}

# A TSan test linked against shared objects runs without the suppressions
# of //third_party/tsan (tests/BUILD, tsan_tests, says why) and fails only
# when a race in Debian's uninstrumented libraries happens to be seen.
tsan_tests_static() {
  local dynamic
  dynamic=$(bazel --batch query 'attr(linkstatic, 0, tests(//tests:tsan_tests))' 2>/dev/null) || return 1
  [[ -z "$dynamic" ]] && return 0
  echo "linkstatic = True missing: $dynamic"
  return 1
}

# libFuzzer targets (fuzz/BUILD): built with clang, each run 60 s from the
# committed seeds, all at once; one count per target.
part_fuzz() {
  local bin
  bin=$(mktemp -d)
  echo "== fuzz: fuzz/build.sh (bazel build --config=fuzz //fuzz/...), then fuzz/run.sh 60 s per target"
  if fuzz/build.sh "$bin" >"$log" 2>&1; then
    fuzz/run.sh "$bin" 60 -1 1 "$(mktemp -d)" | tee "$log"
    passed=$((passed + $(grep -cE '^fuzz_[a-z_]+ .* clean$' "$log")))
    failed=$((failed + $(grep -cE '^fuzz_[a-z_]+ .* CRASH' "$log")))
  else
    cat "$log"
    echo "== fuzz: the build failed"
    failed=$((failed + 1))
  fi
  rm -rf "$bin"
}

part_deploy() {
  local c
  for c in yamllint manifests dockerfile dashboard; do
    check "deploy check $c" tools/deploy_check/run.sh "$c"
  done
}

part_format() {
  check "format" tools/format.sh --check
}

parts=("$@")
((${#parts[@]})) || parts=(all asan tsan fuzz deploy format)
for part in "${parts[@]}"; do
  if [[ "$(type -t "part_$part")" != function ]]; then
    echo "run_tests.sh: unknown part '$part' (all asan tsan fuzz deploy format)" >&2
    failed=$((failed + 1))
    continue
  fi
  "part_$part"
done
rm -f "$log"
echo "$passed passed, $failed failed"
((failed == 0))
