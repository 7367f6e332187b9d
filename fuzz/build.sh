#!/usr/bin/env bash
# Builds the libFuzzer targets with Debian's clang (tools/install_deps.sh
# installs clang and libclang-rt-14-dev), AddressSanitizer and
# UndefinedBehaviorSanitizer, straight from the sources (not through Bazel,
# whose auto-configured toolchain is gcc):
#
#   fuzz/build.sh [OUT]      (default OUT: fuzz/out; binaries OUT/fuzz_*, OUT/make_seeds)
#
# The library sources are compiled once into OUT/obj (in parallel), the
# generated protobuf code into OUT/gen, and every target links them all.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-fuzz/out}" && cd "${1:-fuzz/out}" && pwd)"
CXX="${CXX_FUZZ:-clang++}"
mkdir -p "$OUT/gen" "$OUT/obj"
/usr/bin/protoc -I. --cpp_out="$OUT/gen" proto/driftkv.proto proto/config.proto
SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=all"
CXXFLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer -march=x86-64-v2 -I. -I"$OUT/gen" $SANITIZE)
# Everything the targets reach: codec, transforms, baselines (the codec
# registry names them), backends (CPU), wire, the handler and the snapshot
# file, the generated protobuf code.
SOURCES=(
  codec/*.cc codec/transform/*.cc codec/baselines/*.cc
  backends/*.cc backends/cpu/*.cc wire/*.cc
  service/config.cc service/handler*.cc service/hot_tier.cc service/metrics.cc service/page_verifier.cc
  service/sequence_table.cc service/snapshot_file.cc
  service/tenant.cc service/tokens.cc service/tombstones.cc service/token_digest.cc service/regions.cc
  "$OUT"/gen/proto/*.pb.cc
)
compile() {  # compile SRC: OUT/obj/<path with / as _>.o, when older than the source
  local src=$1 obj
  obj="$OUT/obj/$(echo "$src" | sed "s|^$OUT/||; s|/|_|g").o"
  if [[ ! -f "$obj" || "$src" -nt "$obj" ]]; then
    $CXX "${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
}
export -f compile
export OUT CXX
export CXXFLAGS_STR="${CXXFLAGS[*]}"
printf '%s\n' "${SOURCES[@]}" | xargs -P "$(nproc)" -I{} bash -c 'CXXFLAGS=($CXXFLAGS_STR); compile "$@"' _ {}
LIBS=(-lprotobuf -lprometheus-cpp-core -labsl_status -labsl_statusor -labsl_str_format_internal -labsl_strings
      -labsl_strings_internal -labsl_cord -labsl_cordz_info -labsl_cord_internal -labsl_cordz_functions
      -labsl_cordz_handle -labsl_exponential_biased -labsl_synchronization -labsl_graphcycles_internal
      -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal -labsl_demangle_internal -labsl_malloc_internal
      -labsl_time -labsl_civil_time -labsl_time_zone -labsl_int128 -labsl_throw_delegate -labsl_raw_logging_internal
      -labsl_base -labsl_spinlock_wait -labsl_log_severity -labsl_hash -labsl_city -labsl_low_level_hash
      -labsl_raw_hash_set -labsl_strerror -labsl_hashtablez_sampler -labsl_bad_optional_access
      -labsl_bad_variant_access -lcrypto -pthread)
# make_seeds (fuzz/corpus), linked like the targets but with its own main.
$CXX "${CXXFLAGS[@]}" fuzz/make_seeds.cc "$OUT"/obj/*.o "${LIBS[@]}" -o "$OUT/make_seeds" &
for target in fuzz/fuzz_*.cc; do
  name=$(basename "$target" .cc)
  $CXX "${CXXFLAGS[@]}" -fsanitize=fuzzer "$target" "$OUT"/obj/*.o "${LIBS[@]}" -o "$OUT/$name" &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
((failed == 0)) || { echo "fuzz/build.sh: a link failed" >&2; exit 1; }
ls "$OUT"/fuzz_*
