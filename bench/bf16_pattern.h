// Pseudo-random bf16 values in (-1, 1) for the benchmarks' appends: what
// the pages hold does not change what a move, a fork or a restore costs.
#ifndef DRIFTKV_BENCH_BF16_PATTERN_H_
#define DRIFTKV_BENCH_BF16_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "wire/half.h"

namespace driftkv {
namespace bench {

// `count` bf16 values (little-endian bytes) of pattern `seed`.
inline std::string Bf16Pattern(size_t count, uint32_t seed) {
  std::string out(count * 2, '\0');
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < count; ++i) {
    s = s * 1664525u + 1013904223u;
    const uint16_t b = FloatToBf16(static_cast<float>(static_cast<int32_t>(s >> 8) % 2000) / 1000.0f - 1.0f);
    out[2 * i] = static_cast<char>(b & 0xff);
    out[2 * i + 1] = static_cast<char>(b >> 8);
  }
  return out;
}

}  // namespace bench
}  // namespace driftkv

#endif  // DRIFTKV_BENCH_BF16_PATTERN_H_
