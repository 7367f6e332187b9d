#!/usr/bin/env bash
# clang-format (Debian's clang-format 14, .clang-format at the root) over
# every C++ and CUDA file git tracks (*.h *.cc *.cu *.cuh), except
# third_party/ (generated code is never tracked):
#
#   tools/format.sh           formats the files in place
#   tools/format.sh --check   changes nothing; exits 1 and names each file
#                             that formatting would change
set -euo pipefail
cd "$(dirname "$0")/.."
mode=(-i)
if [[ "${1:-}" == --check ]]; then
  mode=(--dry-run -Werror --ferror-limit=1)  # one message per file
elif (($#)); then
  echo "usage: tools/format.sh [--check]" >&2
  exit 2
fi
command -v clang-format >/dev/null || { echo "format.sh: clang-format not found (tools/install_deps.sh)" >&2; exit 1; }
git ls-files -z -- '*.h' '*.cc' '*.cu' '*.cuh' ':!:third_party/**' |
  xargs -0 --no-run-if-empty clang-format --style=file "${mode[@]}"
