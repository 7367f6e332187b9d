#!/usr/bin/env bash
# Each kernel's machine code size, in instructions (16 bytes each on
# sm_90), of one kernels/ source compiled here to a cubin: a first check of
# a change meant to cut instructions, with no GPU and no cuobjdump (the
# CUDA toolkit here has nvcc and ptxas only). Static counts, not executed
# ones: the device's ncu (bench/device/sass_counts.sh) has the final word.
#
#   tools/kernel_sizes.sh kernels/level_attention.cu [NAME_FILTER]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
src=${1:?usage: $0 SOURCE.cu [NAME_FILTER]}
filter=${2:-.}
base=$(bazel info output_base 2>/dev/null)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
/usr/local/cuda/bin/nvcc -O3 -std=c++17 -I. -I"$base/external/abseil-cpp" -diag-suppress 2810 -arch=sm_90a \
  -cubin -o "$out/k.cubin" "$src" -Xptxas -v 2>"$out/ptxas.log"
grep -E "spill" "$out/ptxas.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" || true
readelf -S -W "$out/k.cubin" 2>/dev/null | awk '$2 ~ /^\.text\./ {print $2, $6}' | while read -r name size; do
  fn=${name#.text.}
  sym=$(echo "$fn" | c++filt 2>/dev/null || echo "$fn")
  [[ $sym =~ $filter ]] || continue
  printf '%7d  %s\n' $((16#$size / 16)) "$sym"
done
