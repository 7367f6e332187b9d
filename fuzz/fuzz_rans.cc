// libFuzzer: the rANS decoders (codec/rans.h). The input picks a frequency
// table, a symbol count and a payload: RansDecode and RansDecodePair must
// never read outside the payload (ASan) and agree with each other; and
// symbols drawn from the input that encode within the capacity must decode
// back exactly.
#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/rans.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int levels = 2 + data[0] % 15;  // [2, 16]
  const int n = 1 + data[1] % 128;
  const size_t capacity = 4 + data[2] % 124;
  data += 3;
  size -= 3;
  // Frequencies >= 1 summing to 256 from the next `levels` bytes.
  uint16_t freq[16] = {};
  int sum = 0;
  for (int m = 0; m < levels; ++m) {
    freq[m] = 1 + (m < static_cast<int>(size) ? data[m] % 16 : 0);
    sum += freq[m];
  }
  freq[levels - 1] += 256 - sum;  // sum <= 16 * 16 = 256
  if (freq[levels - 1] < 1 || sum > 256) return 0;
  RansTable table;
  if (!BuildRansTable(freq, levels, &table).ok()) __builtin_trap();  // a valid table must build
  const size_t skip = std::min<size_t>(levels, size);
  data += skip;
  size -= skip;

  // Arbitrary payload: decode, both ways, identically.
  std::vector<uint8_t> payload(capacity, 0);
  std::memcpy(payload.data(), data, std::min(size, capacity));
  std::vector<uint8_t> a(n), b(n), c(n);
  absl::Status sa = RansDecode(payload.data(), capacity, n, table, a.data());
  absl::Status sb, sc;
  RansDecodePair(payload.data(), payload.data(), capacity, n, table, b.data(), c.data(), &sb, &sc);
  if (sa.ok() != sb.ok() || sb.ok() != sc.ok()) __builtin_trap();
  if (sa.ok() && (a != b || a != c)) __builtin_trap();

  // Symbols from the input: what fits must round-trip.
  std::vector<uint8_t> symbols(n), scratch(n + kStateBytes + 8), out(n), stream(capacity);
  for (int i = 0; i < n; ++i) symbols[i] = (i < static_cast<int>(size) ? data[i] : i) % levels;
  const size_t need = RansEncode(symbols.data(), n, table, stream.data(), capacity, scratch.data());
  if (need <= capacity) {
    if (!RansDecode(stream.data(), capacity, n, table, out.data()).ok()) __builtin_trap();
    if (out != symbols) __builtin_trap();
  }
  return 0;
}
