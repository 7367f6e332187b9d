#!/usr/bin/env bash
# Installs the Debian 12 packages driftkv builds and tests with, if missing.
# Everything else (CUDA) is expected in /usr/local/cuda; Bazel downloads
# nothing (see WORKSPACE).
set -euo pipefail
packages=(
  bazel-bootstrap bazel-rules-java
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libbenchmark-dev
  python3-numpy python3-matplotlib curl
  # the Python client (python/driftkv) and its tests
  python3-grpcio python3-protobuf python3-pytest
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
