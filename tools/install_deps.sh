#!/usr/bin/env bash
# Installs the Debian 12 packages driftkv builds and tests with, if missing,
# and the packages named as arguments (tools/generate.sh: python3-torch and
# r-cran-janeaustenr). Everything else (CUDA) is expected in
# /usr/local/cuda; Bazel downloads nothing (see WORKSPACE).
#
#   tools/install_deps.sh [EXTRA_PACKAGE...]
#
# The deploy/ checks also need (skipped with DRIFTKV_DEPLOY_TOOLS=0, as the
# image build of deploy/Dockerfile does): Debian's prometheus (promtool and
# a server for tests/monitoring_live_test.sh), yamllint, and the npm
# packages of tools/deploy_check/package.json, installed into
# tools/deploy_check/node_modules (git-ignored) by `npm ci` from the
# committed package-lock.json with the machine's Node.js.
set -euo pipefail
packages=(
  bazel-bootstrap bazel-rules-java
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libbenchmark-dev
  python3-numpy python3-matplotlib curl
  # numpy's and torch's BLAS (the libblas.so.3 alternative): OpenBLAS, not
  # the reference BLAS of libblas3, 13-30x slower on a 1024^3 float32 matmul
  # (README.md, "Two commands")
  libopenblas0-pthread
  # TLS: libcrypto for token hashes (service/tokens.h); the openssl tool
  # mints the tests' CA and certificates
  libssl-dev openssl
  # the Python client (python/driftkv) and its tests
  python3-grpcio python3-protobuf python3-pytest
  # CRC-32C of the Python client's chunks in C (it falls back to numpy)
  python3-crc32c
  # the libFuzzer targets and the ASan+UBSan tests (--config=fuzz and
  # --config=asan, .bazelrc): clang 14 and its sanitizer and fuzzer runtimes
  clang libclang-rt-14-dev
  # tools/format.sh (.clang-format)
  clang-format
)
packages+=("$@")
deploy_tools="${DRIFTKV_DEPLOY_TOOLS:-1}"
if [[ "$deploy_tools" != 0 ]]; then
  packages+=(prometheus yamllint)
fi
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

# npm ci when node_modules is missing or older than the lock file. Debian's
# prometheus package ships a systemd unit; nothing starts it here (the tests
# start their own Prometheus on loopback).
if [[ "$deploy_tools" != 0 ]]; then
  deploy_check="$(cd "$(dirname "$0")" && pwd)/deploy_check"
  if ! command -v npm >/dev/null 2>&1; then
    echo "install_deps: npm not found: the deploy/ manifest checks will fail (install Node.js 20 and npm)" >&2
  elif [[ ! -f "$deploy_check/node_modules/.package-lock.json" ||
          "$deploy_check/package-lock.json" -nt "$deploy_check/node_modules/.package-lock.json" ]]; then
    echo "installing: npm packages of tools/deploy_check (npm ci)" >&2
    (cd "$deploy_check" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
fi
