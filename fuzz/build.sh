#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/BUILD) with `bazel build --config=fuzz`
# (.bazelrc: Debian's clang, libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer) and copies the fuzz_* binaries and make_seeds
# to OUT, where fuzz/run.sh finds them:
#
#   fuzz/build.sh [OUT] [BAZEL-ARGS...]   (default OUT: fuzz/out)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-fuzz/out}" && cd "${1:-fuzz/out}" && pwd)"
shift || true
bazel build --config=fuzz "$@" //fuzz/...
BIN="$(bazel info --config=fuzz "$@" bazel-bin 2>/dev/null)/fuzz"
# The targets are the fuzz_* names of fuzz/BUILD; their *_corpus_test
# binaries (replay only) stay behind.
targets=$(bazel query 'kind("cc_binary", //fuzz:*)' 2>/dev/null | sed 's|^//fuzz:||')
rm -f "$OUT"/fuzz_* "$OUT"/make_seeds
for name in $targets; do
  install -m 755 "$BIN/$name" "$OUT/$name"
done
ls "$OUT"/fuzz_*
