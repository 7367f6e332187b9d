// The promotion's table form (kernels/promote_table.h) against rans.h's
// decode step: the same next state and level for every slot of the
// codec's own tables and of random ones, at states across the whole
// 32-bit range (the kernel steps corrupt states too, and must step them as
// the CPU would, so that its verdict on a corrupt record is the CPU's).
#include "kernels/promote_table.h"

#include <cstdint>
#include <random>
#include <vector>

#include "codec/dquant_codec.h"
#include "codec/rans.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace gpu {
namespace {

// Every slot of `table` at states with every X = x >> 8 of `xs`.
void CheckTable(const RansTable& table, const std::vector<uint32_t>& xs) {
  for (uint32_t z = 0; z < 256; ++z) {
    const DecodeEntry e = table.decode[z];
    const uint32_t p = PromoteTableEntry(EntryFreq(e), EntryBias(e), EntrySymbol(e));
    ASSERT_EQ(PromoteEntryLevel(p), EntrySymbol(e)) << "z " << z;
    for (uint32_t hi : xs) {
      const uint32_t x = (hi << 8) | z;
      const uint32_t want = EntryFreq(e) * (x >> 8) + EntryBias(e);
      ASSERT_EQ(PromoteStateStep(x, p), want) << "z " << z << " x " << x << " f " << EntryFreq(e);
    }
  }
}

std::vector<uint32_t> States(uint64_t seed) {
  std::vector<uint32_t> xs = {0, 1, 2, 255, 256, (1u << 15) - 1, 1u << 15, (1u << 23) - 1, 1u << 23, (1u << 24) - 1};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < 2000; ++i) xs.push_back(rng() >> 8);
  return xs;
}

TEST(PromoteTable, CodecTablesStepAsRans) {
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok()) << codec.status();
  CheckTable(codec->key_codec().table(), States(1));
  CheckTable(codec->value_codec().table(), States(2));
}

TEST(PromoteTable, RandomTablesStepAsRans) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int levels = 2 + static_cast<int>(rng() % 15);
    // Frequencies >= 1 summing to 256, some as large as 255 and 1.
    std::vector<uint16_t> freq(levels, 1);
    int left = 256 - levels;
    if (trial % 4 == 0) {
      freq[rng() % levels] += static_cast<uint16_t>(left);
      left = 0;
    }
    while (left > 0) {
      const int add = std::min<int>(left, 1 + static_cast<int>(rng() % 40));
      freq[rng() % levels] += static_cast<uint16_t>(add);
      left -= add;
    }
    RansTable table;
    ASSERT_TRUE(BuildRansTable(freq.data(), levels, &table).ok()) << "trial " << trial;
    CheckTable(table, States(100 + trial));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
