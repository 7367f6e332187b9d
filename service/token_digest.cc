#include "service/token_digest.h"

#include <cstring>

namespace driftkv {
namespace {

constexpr uint64_t kMul1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
constexpr uint64_t kMul2 = 0xC2B2AE3D27D4EB4Full;  // xxHash64's prime 2

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Folds n uint16 values, four per 64-bit word (little-endian), into h.
uint64_t Fold(uint64_t h, const uint16_t* v, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint64_t w;
    std::memcpy(&w, v + i, 8);
    h = Rotl(h ^ (w * kMul2), 31) * kMul1;
  }
  uint64_t tail = 0;
  for (int s = 0; i < n; ++i, s += 16) tail |= static_cast<uint64_t>(v[i]) << s;
  return Rotl(h ^ (tail * kMul2), 31) * kMul1;
}

// MurmurHash3's 64-bit finaliser: every input bit affects every output bit.
uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

uint64_t TokenDigest(const uint16_t* keys, const uint16_t* values, size_t n) {
  uint64_t h = kMul1 ^ n;
  h = Fold(h, keys, n);
  h = Fold(h, values, n);
  return Mix(h);
}

}  // namespace driftkv
