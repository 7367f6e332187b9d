// The device's packing of level pages, on the host: PackKeyGroup and
// PackValueGroup (codec/level_fragments.h, what kernels/level_promote.cu
// runs for every lane and group of a head) build the same blocks as the
// host's PackLevelPage, byte for byte, and UnpackKeyGroup/UnpackValueGroup
// (kernels/level_demote.cu's) give back the levels, for both head sizes,
// full and partial pages, and levels at their extremes. A corrupt value
// byte unpacks to a digit the demotion's range check refuses.
#include "codec/level_fragments.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

constexpr int kKvHeads = 2;
constexpr int kPad = 4;  // the kernels' rows are head_dim + 4 bytes

struct Levels {
  std::vector<uint8_t> keys, values;  // [128][n], channel j = head * D + dim
};

// 0: random; 1: every level at its top; 2: every level 0.
Levels MakeLevels(int n, int tokens, int pattern, uint32_t seed) {
  std::mt19937 rng(seed);
  Levels lv;
  lv.keys.assign(static_cast<size_t>(kLevelPageTokens) * n, 0);
  lv.values.assign(static_cast<size_t>(kLevelPageTokens) * n, 0);
  for (size_t i = 0; i < static_cast<size_t>(tokens) * n; ++i) {
    lv.keys[i] = pattern == 0 ? rng() % kLevelKeyMaxLevels : (pattern == 1 ? kLevelKeyMaxLevels - 1 : 0);
    lv.values[i] = pattern == 0 ? rng() % kLevelValueMaxLevels : (pattern == 1 ? kLevelValueMaxLevels - 1 : 0);
  }
  return lv;
}

// One head's levels as the kernels hold them: rows of D + kPad bytes.
std::vector<uint8_t> HeadRows(const std::vector<uint8_t>& levels, int n, int D, int h) {
  std::vector<uint8_t> rows(static_cast<size_t>(kLevelPageTokens) * (D + kPad), 0xee);
  for (int t = 0; t < kLevelPageTokens; ++t) {
    std::memcpy(rows.data() + t * (D + kPad), levels.data() + static_cast<size_t>(t) * n + h * D, D);
  }
  return rows;
}

std::vector<uint32_t> Words(const uint8_t* bytes, size_t count) {
  std::vector<uint32_t> w(count / 4);
  std::memcpy(w.data(), bytes, count);  // little-endian, as the device
  return w;
}

template <int D>
void PackAllValueGroups(const uint8_t* rows, uint32_t* block) {
  for (int l = 0; l < 32; ++l) {
    PackValueGroup<D, 0>(rows, D + kPad, l, block);
    PackValueGroup<D, 1>(rows, D + kPad, l, block);
    PackValueGroup<D, 2>(rows, D + kPad, l, block);
  }
}

template <int D>
void UnpackAllValueGroups(const uint32_t* block, uint8_t* rows) {
  for (int l = 0; l < 32; ++l) {
    UnpackValueGroup<D, 0>(block, l, rows, D + kPad);
    UnpackValueGroup<D, 1>(block, l, rows, D + kPad);
    UnpackValueGroup<D, 2>(block, l, rows, D + kPad);
  }
}

template <int D>
void CheckShape() {
  absl::StatusOr<LevelPageLayout> layout = MakeLevelPageLayout(kKvHeads, D);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int n = layout->n();
  const std::vector<uint32_t> headers(kLevelPageTokens, 0);
  const std::vector<uint8_t> mean(4 + n, 0);
  for (int pattern = 0; pattern < 3; ++pattern) {
    for (int tokens : {kLevelPageTokens, 77, 1}) {
      SCOPED_TRACE(testing::Message() << "D " << D << " pattern " << pattern << " tokens " << tokens);
      const Levels lv = MakeLevels(n, tokens, pattern, 17u * tokens + pattern);
      std::vector<uint8_t> page(layout->page_bytes);
      PackLevelPage(*layout, tokens, lv.keys.data(), lv.values.data(), headers.data(), headers.data(), mean.data(),
                    page.data());
      for (int h = 0; h < kKvHeads; ++h) {
        const std::vector<uint8_t> key_rows = HeadRows(lv.keys, n, D, h);
        const std::vector<uint8_t> value_rows = HeadRows(lv.values, n, D, h);
        // Packing: every word the device writes, against the host's page.
        std::vector<uint32_t> key_block(layout->key_block_bytes / 4, 0xdeadbeef);
        for (int l = 0; l < 32; ++l) {
          for (int gi = 0; gi < KeyGroupPos<D>::kGroups; ++gi)
            PackKeyGroup<D>(key_rows.data(), D + kPad, l, gi, key_block.data());
        }
        std::vector<uint32_t> value_block(layout->value_block_bytes / 4, 0xdeadbeef);
        PackAllValueGroups<D>(value_rows.data(), value_block.data());
        EXPECT_EQ(key_block, Words(page.data() + layout->key_block(h), layout->key_block_bytes)) << "head " << h;
        EXPECT_EQ(value_block, Words(page.data() + layout->value_block(h), layout->value_block_bytes)) << "head " << h;

        // Unpacking the host's page gives the levels back (absent tokens 0).
        const std::vector<uint32_t> host_keys = Words(page.data() + layout->key_block(h), layout->key_block_bytes);
        const std::vector<uint32_t> host_values =
            Words(page.data() + layout->value_block(h), layout->value_block_bytes);
        std::vector<uint8_t> keys_back(key_rows.size(), 0xee), values_back(value_rows.size(), 0xee);
        for (int l = 0; l < 32; ++l) {
          for (int gi = 0; gi < KeyGroupPos<D>::kGroups; ++gi) {
            UnpackKeyGroup<D>(host_keys.data(), l, gi, keys_back.data(), D + kPad);
          }
        }
        UnpackAllValueGroups<D>(host_values.data(), values_back.data());
        for (int t = 0; t < kLevelPageTokens; ++t) {
          for (int j = 0; j < D; ++j) {
            const size_t at = static_cast<size_t>(t) * (D + kPad) + j;
            ASSERT_EQ(keys_back[at], key_rows[at]) << "key, head " << h << " token " << t << " channel " << j;
            ASSERT_EQ(values_back[at], value_rows[at]) << "value, head " << h << " token " << t << " channel " << j;
          }
          // The row's padding is not the groups' to write.
          for (int j = D; j < D + kPad; ++j) {
            ASSERT_EQ(keys_back[static_cast<size_t>(t) * (D + kPad) + j], 0xee);
            ASSERT_EQ(values_back[static_cast<size_t>(t) * (D + kPad) + j], 0xee);
          }
        }
      }
    }
  }
}

TEST(LevelFragments, DevicePackingIsTheHostsHeadDim128) {
  CheckShape<128>();
}
TEST(LevelFragments, DevicePackingIsTheHostsHeadDim64) {
  CheckShape<64>();
}

TEST(LevelFragments, CorruptValueByteUnpacksOutOfRange) {
  constexpr int D = 128;
  absl::StatusOr<LevelPageLayout> layout = MakeLevelPageLayout(1, D);
  ASSERT_TRUE(layout.ok());
  std::vector<uint32_t> block(layout->value_block_bytes / 4, 0);
  block[0] = 255u;  // lane 0's first E byte: no three base-6 digits make it
  std::vector<uint8_t> rows(static_cast<size_t>(kLevelPageTokens) * (D + kPad), 0);
  UnpackAllValueGroups<D>(block.data(), rows.data());
  uint8_t top = 0;
  for (uint8_t v : rows) top = std::max(top, v);
  EXPECT_GE(top, kLevelValueMaxLevels);
}

}  // namespace
}  // namespace driftkv
