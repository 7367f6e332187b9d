// rANS: bit-exact round trips, the fixed payload, and corrupt input.
#include "codec/rans.h"

#include <algorithm>
#include <random>
#include <vector>

#include "codec/rans_encode_step.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

// Random frequencies: each >= 1, sum 256.
std::vector<uint16_t> RandomFreq(int levels, std::mt19937_64& rng) {
  std::vector<uint16_t> f(levels, 1);
  std::uniform_int_distribution<int> pick(0, levels - 1);
  for (int left = 256 - levels; left > 0; --left) ++f[pick(rng)];
  return f;
}

TEST(Rans, RoundTripIsBitExactOnRandomStrings) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    const int levels = 2 + iter % 15;
    std::vector<uint16_t> f = RandomFreq(levels, rng);
    RansTable table;
    ASSERT_TRUE(BuildRansTable(f.data(), levels, &table).ok());
    const int n = 1 + static_cast<int>(rng() % 1500);
    std::vector<uint8_t> sym(n), back(n), payload(n + 8), scratch(n + kStateBytes);
    // Draw symbols from the table's own distribution half the time, uniformly otherwise.
    for (int i = 0; i < n; ++i) {
      sym[i] = iter % 2 ? EntrySymbol(table.decode[rng() & 255]) : static_cast<uint8_t>(rng() % levels);
    }
    const size_t used = RansEncode(sym.data(), n, table, payload.data(), payload.size(), scratch.data());
    ASSERT_LE(used, payload.size());
    ASSERT_TRUE(RansDecode(payload.data(), payload.size(), n, table, back.data()).ok());
    ASSERT_EQ(sym, back) << "iteration " << iter;
    // The tail after the used bytes is zero.
    for (size_t i = used; i < payload.size(); ++i) ASSERT_EQ(payload[i], 0);
    // Decoding from exactly `used` bytes works too (nothing past it is read).
    ASSERT_TRUE(RansDecode(payload.data(), used, n, table, back.data()).ok());
  }
}

// The coder as codec/rans.h defines it, with a division: the reference the
// division-free step (codec/rans_encode_step.h) must reproduce byte for byte.
std::vector<uint8_t> EncodeByDivision(const std::vector<uint8_t>& sym, const RansTable& t) {
  std::vector<uint8_t> rev;
  uint32_t x = kStateLow;
  for (int i = static_cast<int>(sym.size()) - 1; i >= 0; --i) {
    const uint32_t f = t.freq[sym[i]];
    if (x >= (kStateLow >> kProbBits << 8) * f) {
      rev.push_back(static_cast<uint8_t>(x));
      x >>= 8;
    }
    x = ((x / f) << kProbBits) + x % f + t.cum[sym[i]];
  }
  for (int b = 3; b >= 0; --b) rev.push_back(static_cast<uint8_t>(x >> (8 * b)));
  return std::vector<uint8_t>(rev.rbegin(), rev.rend());
}

// floor(x / f) for every frequency at the states the coder meets: every x
// near each multiple of f at the ends and middle of [2^15, 2^31), near the
// renormalisation threshold f 2^23, and 20,000 random states per f.
TEST(RansEncodeStep, QuotientIsExactForEveryFrequency) {
  std::mt19937_64 rng(11);
  for (uint32_t f = 1; f <= 256; ++f) {
    const RansEncodeEntry e = MakeRansEncodeEntry(f, 0);
    ASSERT_LE(e.shift, 8u);
    auto check = [&](uint64_t x) {
      if (x >= kStateHigh) return;
      ASSERT_EQ(RansQuotient(static_cast<uint32_t>(x), e.rcp, e.shift), static_cast<uint32_t>(x) / f)
          << "x " << x << " f " << f;
    };
    const uint64_t anchors[] = {1u << 15, uint64_t{f} << 15, uint64_t{f} << 23,   1u << 23,
                                1u << 30, kStateHigh - 1,    (kStateHigh / f) * f};
    for (uint64_t a : anchors) {
      for (int64_t d = -3 * static_cast<int64_t>(f) - 2; d <= 3 * static_cast<int64_t>(f) + 2; ++d) {
        if (static_cast<int64_t>(a) + d >= 0) check(static_cast<uint64_t>(static_cast<int64_t>(a) + d));
      }
    }
    for (int i = 0; i < 20000; ++i) check(rng() % kStateHigh);
  }
}

TEST(RansEncodeStep, EncoderEqualsTheDivisionCoder) {
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 3000; ++iter) {
    const int levels = 2 + iter % 15;
    std::vector<uint16_t> f = RandomFreq(levels, rng);
    // Extreme tables too: one symbol of frequency 1, or all but one at 1.
    if (iter % 7 == 0) {
      std::fill(f.begin(), f.end(), 1);
      f[rng() % levels] = static_cast<uint16_t>(256 - (levels - 1));
    }
    RansTable table;
    ASSERT_TRUE(BuildRansTable(f.data(), levels, &table).ok());
    const int n = 1 + static_cast<int>(rng() % 1200);
    std::vector<uint8_t> sym(n);
    for (int i = 0; i < n; ++i) {
      sym[i] = iter % 2 ? EntrySymbol(table.decode[rng() & 255]) : static_cast<uint8_t>(rng() % levels);
    }
    const std::vector<uint8_t> want = EncodeByDivision(sym, table);
    std::vector<uint8_t> payload(want.size()), scratch(n + kStateBytes);
    ASSERT_EQ(RansEncode(sym.data(), n, table, payload.data(), payload.size(), scratch.data()), want.size());
    ASSERT_EQ(payload, want) << "iteration " << iter;
  }
}

TEST(Rans, LengthTracksIdealCost) {
  std::mt19937_64 rng(3);
  const uint16_t f[8] = {1, 3, 30, 94, 94, 30, 3, 1};
  RansTable table;
  ASSERT_TRUE(BuildRansTable(f, 8, &table).ok());
  const int n = 1024;
  std::vector<uint8_t> sym(n), payload(2 * n), scratch(n + kStateBytes);
  for (int iter = 0; iter < 200; ++iter) {
    double ideal = 0;
    for (int i = 0; i < n; ++i) {
      sym[i] = EntrySymbol(table.decode[rng() & 255]);
      ideal += table.cost_bits[sym[i]];
    }
    const size_t used = RansEncode(sym.data(), n, table, payload.data(), payload.size(), scratch.data());
    // used*8 = ideal + state (32 bits) - what the final state still holds
    // (0..8 bits) + byte rounding and the coder's tiny precision loss.
    EXPECT_LE(8.0 * used, ideal + kStateBits + 16) << iter;
    EXPECT_GE(8.0 * used, ideal + kStateBits - 16) << iter;
  }
}

TEST(Rans, ReportsNeededBytesWhenTooSmall) {
  const uint16_t f[2] = {128, 128};
  RansTable table;
  ASSERT_TRUE(BuildRansTable(f, 2, &table).ok());
  std::vector<uint8_t> sym(800, 1), payload(50), scratch(800 + kStateBytes);
  EXPECT_EQ(RansEncode(sym.data(), 800, table, payload.data(), payload.size(), scratch.data()),
            100u + kStateBytes);  // exactly 1 bit per symbol
}

TEST(Rans, CorruptPayloadsNeverReadOutOfBounds) {
  std::mt19937_64 rng(11);
  const uint16_t f[6] = {1, 14, 113, 113, 14, 1};
  RansTable table;
  ASSERT_TRUE(BuildRansTable(f, 6, &table).ok());
  const int n = 1024;
  int detected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    // Heap buffer of exactly the payload size, so ASan flags any overread.
    const size_t cap = 4 + rng() % 300;
    std::vector<uint8_t> payload(cap), sym(n);
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    if (iter % 3 == 0) payload[3] &= 0x7f;  // a valid-range state now and then
    const absl::Status st = RansDecode(payload.data(), cap, n, table, sym.data());
    for (uint8_t s : sym) ASSERT_LT(s, 6);
    detected += !st.ok();
  }
  // Random bytes almost never end exactly in the initial state.
  EXPECT_GT(detected, 2990);
}

TEST(Rans, PairDecoderEqualsSingleDecoder) {
  std::mt19937_64 rng(21);
  const uint16_t f[8] = {1, 3, 30, 94, 94, 30, 3, 1};
  RansTable table;
  ASSERT_TRUE(BuildRansTable(f, 8, &table).ok());
  const int n = 700;
  for (int iter = 0; iter < 500; ++iter) {
    const size_t cap = 200 + rng() % 200;
    std::vector<uint8_t> a(cap), b(cap), scratch(n + kStateBytes), sym(n);
    for (auto* p : {&a, &b}) {
      for (auto& s : sym) s = EntrySymbol(table.decode[rng() & 255]);
      RansEncode(sym.data(), n, table, p->data(), cap, scratch.data());
      if (iter % 4 == 0) (*p)[rng() % cap] ^= 0x5a;  // corrupt some
    }
    std::vector<uint8_t> pa(n), pb(n), ua(n), ub(n);
    absl::Status sa, sb;
    RansDecodePair(a.data(), b.data(), cap, n, table, pa.data(), pb.data(), &sa, &sb);
    const absl::Status ta = RansDecode(a.data(), cap, n, table, ua.data());
    const absl::Status tb = RansDecode(b.data(), cap, n, table, ub.data());
    ASSERT_EQ(pa, ua);
    ASSERT_EQ(pb, ub);
    ASSERT_EQ(sa.ok(), ta.ok());
    ASSERT_EQ(sb.ok(), tb.ok());
  }
}

TEST(Rans, RejectsBadTables) {
  RansTable t;
  const uint16_t zero[3] = {0, 128, 128};
  EXPECT_FALSE(BuildRansTable(zero, 3, &t).ok());
  const uint16_t short_sum[2] = {100, 100};
  EXPECT_FALSE(BuildRansTable(short_sum, 2, &t).ok());
  const uint16_t one[1] = {256};
  EXPECT_FALSE(BuildRansTable(one, 1, &t).ok());
}

}  // namespace
}  // namespace driftkv
