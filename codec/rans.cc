#include "codec/rans.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace driftkv {

absl::Status BuildRansTable(const uint16_t* freq, int levels, RansTable* table) {
  if (levels < kMinLevels || levels > kMaxLevels) {
    return absl::InvalidArgumentError(
        absl::StrCat("levels ", levels, " out of range [", kMinLevels, ", ", kMaxLevels, "]"));
  }
  uint32_t sum = 0;
  for (int m = 0; m < levels; ++m) {
    if (freq[m] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("frequency of level ", m, " is 0"));
    }
    sum += freq[m];
  }
  if (sum != kProbScale) {
    return absl::InvalidArgumentError(absl::StrCat("frequencies sum to ", sum, ", not ", kProbScale));
  }
  *table = RansTable();
  table->levels = levels;
  uint32_t c = 0;
  for (int m = 0; m < levels; ++m) {
    table->freq[m] = freq[m];
    table->cum[m] = static_cast<uint16_t>(c);
    table->cost_bits[m] = static_cast<float>(-std::log2(static_cast<double>(freq[m]) / kProbScale));
    table->encode[m] = MakeRansEncodeEntry(freq[m], c);
    for (uint32_t z = c; z < c + freq[m]; ++z) {
      table->decode[z] = (static_cast<uint32_t>(freq[m]) << kEntryFreqShift) | ((z - c) << kEntryBiasShift) |
                         (static_cast<uint32_t>(m) << kEntrySymbolShift);
    }
    c += freq[m];
  }
  return absl::OkStatus();
}

size_t RansEncode(const uint8_t* symbols, int n, const RansTable& table, uint8_t* payload, size_t capacity,
                  uint8_t* scratch) {
  // Bytes are written backwards from the end of scratch.
  uint8_t* const end = scratch + n + kStateBytes;
  uint8_t* ptr = end;
  uint32_t x = kStateLow;
  for (int i = n - 1; i >= 0; --i) {
    const RansEncodeEntry& e = table.encode[symbols[i]];
    // Keep x < 2^23 * f so that the encoded state stays below 2^31. Since
    // x < 2^31 and f >= 1, at most one byte leaves per symbol.
    uint32_t q = RansQuotient(x, e.rcp, e.shift);
    if (RansMustEmit(q)) {
      *--ptr = static_cast<uint8_t>(x & 0xff);
      x >>= 8;
      q >>= 8;
    }
    x = RansCoded(x, q, e.cmpl, e.cum);
  }
  ptr -= kStateBytes;
  ptr[0] = static_cast<uint8_t>(x);
  ptr[1] = static_cast<uint8_t>(x >> 8);
  ptr[2] = static_cast<uint8_t>(x >> 16);
  ptr[3] = static_cast<uint8_t>(x >> 24);
  const size_t used = static_cast<size_t>(end - ptr);
  if (used <= capacity) {
    std::memcpy(payload, ptr, used);
    std::memset(payload + used, 0, capacity - used);
  }
  return used;
}

namespace {

// The initial state of a payload; out of range (corrupt) states are replaced
// by kStateLow so that decoding stays deterministic and in range.
uint32_t LoadState(const uint8_t* p, bool* bad) {
  const uint32_t x = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  *bad = x < kStateLow || x >= kStateHigh;
  return *bad ? kStateLow : x;
}

// Each symbol pulls at most one byte, so the first (capacity - 4) symbols
// cannot run past the payload: callers decode those without a bounds check.
int UncheckedSymbols(size_t capacity, int n) {
  return static_cast<int>(std::min<size_t>(n, capacity - kStateBytes));
}

// Decodes symbols [i, n) with a bounds check (only a corrupt stream reads
// past the payload; it reads zeros there) and checks how the stream ended.
absl::Status FinishDecode(const uint8_t* payload, size_t capacity, int n, int i, uint32_t x, size_t ptr, bool bad_state,
                          const RansTable& table, uint8_t* symbols) {
  for (; i < n; ++i) {
    const DecodeEntry e = table.decode[x & (kProbScale - 1)];
    symbols[i] = static_cast<uint8_t>(EntrySymbol(e));
    x = EntryFreq(e) * (x >> kProbBits) + EntryBias(e);
    if (x < kStateLow) {
      x = (x << 8) | (ptr < capacity ? payload[ptr] : 0u);
      ++ptr;
    }
  }
  if (bad_state) return absl::DataLossError("rANS initial state out of range");
  if (ptr > capacity) {
    return absl::DataLossError(absl::StrCat("rANS stream runs past its ", capacity, "-byte payload"));
  }
  if (x != kStateLow) return absl::DataLossError("rANS final state mismatch");
  return absl::OkStatus();
}

}  // namespace

absl::Status RansDecode(const uint8_t* payload, size_t capacity, int n, const RansTable& table, uint8_t* symbols) {
  if (capacity < static_cast<size_t>(kStateBytes)) {
    std::memset(symbols, 0, n);
    return absl::DataLossError(absl::StrCat("payload of ", capacity, " bytes cannot hold the rANS state"));
  }
  bool bad_state;
  uint32_t x = LoadState(payload, &bad_state);
  size_t ptr = kStateBytes;
  const int unchecked = UncheckedSymbols(capacity, n);
  int i = 0;
  for (; i < unchecked; ++i) {
    const DecodeEntry e = table.decode[x & (kProbScale - 1)];
    symbols[i] = static_cast<uint8_t>(EntrySymbol(e));
    x = EntryFreq(e) * (x >> kProbBits) + EntryBias(e);
    // Branch-free renormalisation: the byte is loaded either way.
    const uint32_t need = x < kStateLow;
    const uint32_t shifted = (x << 8) | payload[ptr];
    x = need ? shifted : x;
    ptr += need;
  }
  return FinishDecode(payload, capacity, n, i, x, ptr, bad_state, table, symbols);
}

void RansDecodePair(const uint8_t* pa, const uint8_t* pb, size_t capacity, int n, const RansTable& table, uint8_t* sa,
                    uint8_t* sb, absl::Status* status_a, absl::Status* status_b) {
  if (capacity < static_cast<size_t>(kStateBytes)) {
    *status_a = RansDecode(pa, capacity, n, table, sa);
    *status_b = RansDecode(pb, capacity, n, table, sb);
    return;
  }
  bool bad_a, bad_b;
  uint32_t xa = LoadState(pa, &bad_a), xb = LoadState(pb, &bad_b);
  size_t qa = kStateBytes, qb = kStateBytes;
  const int unchecked = UncheckedSymbols(capacity, n);
  int i = 0;
  for (; i < unchecked; ++i) {  // the two chains of RansDecode's loop, interleaved
    const DecodeEntry ea = table.decode[xa & (kProbScale - 1)];
    const DecodeEntry eb = table.decode[xb & (kProbScale - 1)];
    sa[i] = static_cast<uint8_t>(EntrySymbol(ea));
    sb[i] = static_cast<uint8_t>(EntrySymbol(eb));
    xa = EntryFreq(ea) * (xa >> kProbBits) + EntryBias(ea);
    xb = EntryFreq(eb) * (xb >> kProbBits) + EntryBias(eb);
    const uint32_t na = xa < kStateLow, nb = xb < kStateLow;
    const uint32_t ya = (xa << 8) | pa[qa], yb = (xb << 8) | pb[qb];
    xa = na ? ya : xa;
    xb = nb ? yb : xb;
    qa += na;
    qb += nb;
  }
  *status_a = FinishDecode(pa, capacity, n, i, xa, qa, bad_a, table, sa);
  *status_b = FinishDecode(pb, capacity, n, i, xb, qb, bad_b, table, sb);
}

}  // namespace driftkv
