#include "codec/baselines/base_m.h"

#include <cstring>

namespace driftkv {
namespace baselines {
namespace {

// limbs = limbs * m + add (little-endian 32-bit limbs), growing as needed.
void MulAdd(std::vector<uint32_t>* limbs, uint32_t m, uint32_t add) {
  uint64_t carry = add;
  for (uint32_t& w : *limbs) {
    const uint64_t v = static_cast<uint64_t>(w) * m + carry;
    w = static_cast<uint32_t>(v);
    carry = v >> 32;
  }
  if (carry != 0) limbs->push_back(static_cast<uint32_t>(carry));
}

// limbs /= m; returns the remainder. Leading zero limbs are kept.
uint32_t DivMod(std::vector<uint32_t>* limbs, uint32_t m) {
  uint64_t rem = 0;
  for (size_t i = limbs->size(); i-- > 0;) {
    const uint64_t cur = (rem << 32) | (*limbs)[i];
    (*limbs)[i] = static_cast<uint32_t>(cur / m);
    rem = cur % m;
  }
  return static_cast<uint32_t>(rem);
}

// Symbols per 32-bit chunk: the largest k with M^k < 2^32, so that packing
// and unpacking run one multi-word operation per k symbols.
int ChunkDigits(int m) {
  uint64_t p = 1;
  int k = 0;
  while (p * m <= 0xffffffffull) {
    p *= m;
    ++k;
  }
  return k;
}

}  // namespace

size_t BaseMBytes(int n, int m) {
  std::vector<uint32_t> p = {1};
  for (int i = 0; i < n; ++i) MulAdd(&p, static_cast<uint32_t>(m), 0);
  // Bit length of M^n - 1: M^n has bit length L; M^n - 1 has L - 1 bits
  // exactly when M^n is a power of two.
  size_t top = p.size() - 1;
  while (top > 0 && p[top] == 0) --top;
  size_t bits = 32 * top;
  uint32_t w = p[top];
  int width = 0;
  while (w != 0) {
    ++width;
    w >>= 1;
  }
  bits += width;
  bool power_of_two = (p[top] & (p[top] - 1)) == 0;
  for (size_t i = 0; i < top && power_of_two; ++i) power_of_two = p[i] == 0;
  if (power_of_two) --bits;
  return (bits + 7) / 8;
}

void PackBaseM(const uint8_t* symbols, int n, int m, size_t bytes, uint8_t* out, std::vector<uint32_t>* limbs) {
  limbs->assign(1, 0);
  const int k = ChunkDigits(m);
  // Horner's rule, k digits at a time from the most significant end.
  for (int end = n; end > 0; end -= k) {
    const int start = end > k ? end - k : 0;
    uint32_t chunk = 0, power = 1;
    for (int i = end - 1; i >= start; --i) {
      chunk = chunk * m + symbols[i];
      power *= m;
    }
    MulAdd(limbs, power, chunk);
  }
  std::memset(out, 0, bytes);
  for (size_t b = 0; b < bytes && b / 4 < limbs->size(); ++b) {
    out[b] = static_cast<uint8_t>((*limbs)[b / 4] >> (8 * (b % 4)));
  }
}

absl::Status UnpackBaseM(const uint8_t* in, size_t bytes, int n, int m, uint8_t* symbols,
                         std::vector<uint32_t>* limbs) {
  limbs->assign((bytes + 3) / 4, 0);
  for (size_t b = 0; b < bytes; ++b) (*limbs)[b / 4] |= static_cast<uint32_t>(in[b]) << (8 * (b % 4));
  const int k = ChunkDigits(m);
  for (int start = 0; start < n; start += k) {
    const int len = n - start < k ? n - start : k;
    uint32_t power = 1;
    for (int i = 0; i < len; ++i) power *= m;
    uint32_t r = DivMod(limbs, power);
    for (int i = 0; i < len; ++i) {
      symbols[start + i] = static_cast<uint8_t>(r % m);
      r /= m;
    }
  }
  for (uint32_t w : *limbs) {
    if (w != 0) return absl::DataLossError("base-M record holds a value >= M^n");
  }
  return absl::OkStatus();
}

}  // namespace baselines
}  // namespace driftkv
