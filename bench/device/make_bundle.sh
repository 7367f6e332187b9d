#!/usr/bin/env bash
# Builds the bundle a device call runs (.device/bundle, git-ignored): this
# tree's TARGETS, and for an A/B the same binaries of earlier commits under
# other names, stripped, with their libraries.
#
#   bench/device/make_bundle.sh [NAME=COMMIT:TARGET ...] [--] TARGET...
#   bench/device/make_bundle.sh bench_gpu-mid=daf577a://bench:bench_gpu -- \
#       //bench:bench_gpu //kernels:page_crc_test
#
# The earlier commits are built first, in this workspace (bazel's cache
# makes each a few actions), their binaries copied out before the next
# checkout; this tree is built last, so every binary bundled under its
# own name is this tree's: a test bundled from bazel-bin after an earlier
# commit's build would load that commit's libraries. Needs a clean tree
# (the checkouts would carry changes along) and ends on the branch it
# started from. Prints each binary's checksum and the size that travels
# (the device takes 64 MiB with the tree).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
olds=()
while (($#)) && [[ $1 != -- && $1 == *=*:* ]]; do
  olds+=("$1")
  shift
done
[[ ${1:-} == -- ]] && shift
(($#)) || { echo "usage: $0 [NAME=COMMIT:TARGET ...] [--] TARGET..." >&2; exit 2; }
if [[ -n $(git status --porcelain --untracked-files=no) ]]; then
  echo "commit or stash first: the earlier commits' checkouts need a clean tree" >&2
  exit 2
fi
start=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
stage=$(mktemp -d)
trap 'git checkout -q "$start"; rm -rf "$stage"' EXIT
bin_of() { # //pkg:name -> bazel-bin/pkg/name
  local t=${1#//}
  echo "bazel-bin/${t%%:*}/${t##*:}"
}
for spec in "${olds[@]}"; do
  name=${spec%%=*} rest=${spec#*=}
  commit=${rest%%:*} target=${rest#*:}
  echo "== $name: $target at $commit"
  git checkout -q --detach "$commit"
  # Linked statically: a test's own libraries would be this tree's by
  # the time the bundle is made.
  bazel build --config=ci --dynamic_mode=off "$target" >/dev/null 2>&1 ||
    { echo "build of $target at $commit failed" >&2; exit 1; }
  cp -L "$(bin_of "$target")" "$stage/$name"
done
git checkout -q "$start"
echo "== this tree ($(git rev-parse --short HEAD)): $*"
bazel build --config=ci "$@" >/dev/null 2>&1 || { echo "build failed: bazel build --config=ci $*" >&2; exit 1; }
bins=()
for t in "$@"; do bins+=("$(bin_of "$t")"); done
shopt -s nullglob
rm -rf .device/bundle
../shared/tools/bundle-for-device .device/bundle "${bins[@]}" "$stage"/* >/dev/null
chmod -R u+w .device/bundle
strip .device/bundle/bin/*
strip --strip-unneeded .device/bundle/lib/*.so* 2>/dev/null || true
(cd .device/bundle/bin && md5sum *)
echo "travels: $(($(du -sb .device | cut -f1) + $(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}'))) bytes of 67108864"
