// The hot tier on the GPU: promotion of cold pages gives the CPU's level
// pages byte for byte, demotion gives the CPU's cold pages byte for byte, attention on level pages meets the float64
// rule of gpu_test_util.h over the same decoded tokens, and an item's output is bit-identical alone, inside a large
// mixed batch, and on a second run.
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "codec/dquant_codec.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/level_attention.h"
#include "kernels/level_decode.h"
#include "kernels/level_demote.h"
#include "kernels/level_promote.h"
#include "kernels/testing/batch_builder.h"
#include "kernels/testing/device_buffer.h"
#include "kernels/testing/gpu_test_util.h"

namespace driftkv {
namespace gpu {
namespace {

const ::testing::Environment* const kErrorReport = ::testing::AddGlobalTestEnvironment(new WorstErrorReport);

// A cold batch and the same pages as level pages (CPU PromotePage), page ids
// unchanged.
struct HotBatch {
  HostDQuantBatch cold;
  LevelPageLayout hot;
  std::vector<uint8_t> hot_pool;
  std::vector<int32_t> page_tokens;  // tokens held by each page id
};

void BuildHotBatch(const DQuantCodec& codec, int q_heads, const std::vector<int>& tokens,
                   const std::vector<int>& window, uint64_t seed, HotBatch* b) {
  ASSERT_TRUE(BuildDQuantBatch(codec, q_heads, tokens, window, /*shuffle=*/true, seed, &b->cold).ok());
  auto lay = MakeLevelPageLayout(codec);
  ASSERT_TRUE(lay.ok()) << lay.status();
  b->hot = *lay;
  const PageLayout& cl = b->cold.layout;
  const size_t pages = b->cold.pool.size() / cl.page_bytes;
  b->hot_pool.assign(pages * b->hot.page_bytes, 0xee);
  b->page_tokens.assign(pages, 0);
  for (int i = 0; i < b->cold.items(); ++i) {
    const int np = (b->cold.tokens[i] + kPageTokens - 1) / kPageTokens;
    for (int k = 0; k < np; ++k) {
      const int id = b->cold.page_table[b->cold.page_start[i] + k];
      b->page_tokens[id] = std::min(kPageTokens, b->cold.tokens[i] - k * kPageTokens);
    }
  }
  for (size_t id = 0; id < pages; ++id) {
    if (b->page_tokens[id] == 0) continue;
    const uint8_t* page = b->cold.pool.data() + id * cl.page_bytes;
    absl::Status st = PromotePage(codec, b->hot, page, page + cl.value_offset, page + cl.mean_offset,
                                  b->page_tokens[id], b->hot_pool.data() + id * b->hot.page_bytes);
    ASSERT_TRUE(st.ok()) << st;
  }
}

// Demotes `ids` (level page id = cold page id) of `hot_pool` on the device
// into a cold pool that starts as `cold_start`; the pool and the statuses.
void DemoteOnDevice(const DQuantCodec& codec, const PageLayout& cl, const LevelPageLayout& hl,
                    const std::vector<uint8_t>& hot_pool, const std::vector<uint8_t>& cold_start,
                    const std::vector<int32_t>& ids, const std::vector<int32_t>& toks, std::vector<uint8_t>* cold_out,
                    std::vector<int32_t>* status) {
  DeviceBuffer hot, cold, dids, dtok, dstat;
  ASSERT_TRUE(hot.Upload(hot_pool) && cold.Upload(cold_start) && dids.Upload(ids) && dtok.Upload(toks) &&
              dstat.Resize(ids.size() * 4));
  DemoteParams dp;
  dp.hot_pool_dev = hot.get<uint8_t>();
  dp.hot = hl;
  dp.cold_pool_dev = cold.get<uint8_t>();
  dp.cold = cl;
  SetDemoteTables(codec, &dp);
  dp.pages = static_cast<int>(ids.size());
  dp.hot_pages_dev = dids.get<int32_t>();
  dp.cold_pages_dev = dids.get<int32_t>();
  dp.tokens_dev = dtok.get<int32_t>();
  dp.status_dev = dstat.get<int32_t>();
  absl::Status st = LaunchDemote(dp, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(cold.Download(cold_out) && dstat.Download(status));
}

struct HotRun {
  std::vector<float> out, lse;
};

// Runs the level kernel on items [first, first + count) of the batch, with
// the window and the merge where `merge` says, twice in a row, the merge
// counters zeroed once: they must be zero again after each launch.
void RunLevel(const HotBatch& b, const DeviceBuffer& pool, int first, int count, LevelMerge merge, HotRun* r) {
  DeviceItems dev;
  ASSERT_TRUE(dev.Upload(b.cold, first, count));
  DeviceBuffer counters;
  ASSERT_TRUE(counters.Upload(std::vector<uint32_t>(static_cast<size_t>(count) * b.hot.kv_heads, 0u)));
  LevelAttentionParams p;
  p.batch = dev.batch();
  p.pool_dev = pool.get<uint8_t>();
  p.layout = b.hot;
  p.merge_counters_dev = counters.get<uint32_t>();
  p.merge = merge;
  for (int run = 0; run < 2; ++run) {
    absl::Status st = LaunchLevelAttention(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint32_t> left;
    ASSERT_TRUE(counters.Download(&left));
    for (size_t k = 0; k < left.size(); ++k) ASSERT_EQ(left[k], 0u) << "merge counter " << k << " after run " << run;
  }
  ASSERT_TRUE(dev.Download(&r->out, &r->lse));
}

// query_scale multiplies the batch's random queries (the references see
// the same scaled queries).
void RunCase(int kv_heads, int d, int q_heads, const std::vector<int>& tokens, const std::vector<int>& window,
             uint64_t seed, float query_scale = 1.0f) {
  DQuantConfig cfg;
  cfg.kv_heads = kv_heads;
  cfg.head_dim = d;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok()) << codec.status();
  HotBatch b;
  BuildHotBatch(*codec, q_heads, tokens, window, seed, &b);
  if (::testing::Test::HasFatalFailure()) return;
  for (float& x : b.cold.query) x *= query_scale;
  const HostDQuantBatch& c = b.cold;

  // Promotion on the device, every used page, against the CPU's bytes.
  {
    std::vector<int32_t> ids, toks;
    for (size_t id = 0; id < b.page_tokens.size(); ++id) {
      if (b.page_tokens[id] > 0) ids.push_back(static_cast<int32_t>(id)), toks.push_back(b.page_tokens[id]);
    }
    const std::vector<uint32_t> tables = PromoteDecodeTables(*codec);
    DeviceBuffer cold, hot, dtab, dids, dtok, dstat;
    ASSERT_TRUE(cold.Upload(c.pool) && dtab.Upload(tables) && dids.Upload(ids) && dtok.Upload(toks) &&
                dstat.Resize(ids.size() * 4));
    std::vector<uint8_t> poison(b.hot_pool.size(), 0xa5);
    ASSERT_TRUE(hot.Upload(poison));
    PromoteParams pp;
    pp.cold_pool_dev = cold.get<uint8_t>();
    pp.cold = c.layout;
    pp.hot_pool_dev = hot.get<uint8_t>();
    pp.hot = b.hot;
    SetPromoteCodec(*codec, dtab.get<uint32_t>(), &pp);
    pp.pages = static_cast<int>(ids.size());
    pp.cold_pages_dev = dids.get<int32_t>();
    pp.hot_pages_dev = dids.get<int32_t>();
    pp.tokens_dev = dtok.get<int32_t>();
    pp.status_dev = dstat.get<int32_t>();
    absl::Status st = LaunchPromote(pp, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got;
    std::vector<int32_t> status;
    ASSERT_TRUE(hot.Download(&got) && dstat.Download(&status));
    for (size_t k = 0; k < ids.size(); ++k) {
      EXPECT_EQ(status[k], 0) << "page " << ids[k];
      const size_t off = static_cast<size_t>(ids[k]) * b.hot.page_bytes;
      ASSERT_EQ(0, std::memcmp(got.data() + off, b.hot_pool.data() + off, b.hot.page_bytes))
          << "GPU promotion differs from PromotePage, page " << ids[k] << " (" << toks[k] << " tokens)";
    }
  }

  // Demotion on the device of the CPU's level pages, against DemotePage on
  // the same starting bytes (which also gives the original cold records).
  {
    std::vector<int32_t> ids, toks;
    for (size_t id = 0; id < b.page_tokens.size(); ++id) {
      if (b.page_tokens[id] > 0) ids.push_back(static_cast<int32_t>(id)), toks.push_back(b.page_tokens[id]);
    }
    const PageLayout& cl = c.layout;
    std::vector<uint8_t> start(c.pool.size(), 0x5a), want = start, got;
    std::vector<int32_t> status;
    for (size_t k = 0; k < ids.size(); ++k) {
      uint8_t* page = want.data() + static_cast<size_t>(ids[k]) * cl.page_bytes;
      absl::Status st = DemotePage(*codec, b.hot, b.hot_pool.data() + static_cast<size_t>(ids[k]) * b.hot.page_bytes,
                                   toks[k], page, page + cl.value_offset, page + cl.mean_offset);
      ASSERT_TRUE(st.ok()) << st;
    }
    DemoteOnDevice(*codec, cl, b.hot, b.hot_pool, start, ids, toks, &got, &status);
    if (::testing::Test::HasFatalFailure()) return;
    for (size_t k = 0; k < ids.size(); ++k) {
      EXPECT_EQ(status[k], 0) << "page " << ids[k];
      const size_t off = static_cast<size_t>(ids[k]) * cl.page_bytes;
      ASSERT_EQ(0, std::memcmp(got.data() + off, want.data() + off, cl.page_bytes))
          << "GPU demotion differs from DemotePage, page " << ids[k] << " (" << toks[k] << " tokens)";
      // Tokens held: the original cold records, byte for byte.
      for (int t = 0; t < toks[k]; ++t) {
        ASSERT_EQ(
            0, std::memcmp(got.data() + off + cl.key_record(t), c.pool.data() + off + cl.key_record(t), cl.key_stride))
            << "key record " << t << " of page " << ids[k];
        ASSERT_EQ(0, std::memcmp(got.data() + off + cl.value_record(t), c.pool.data() + off + cl.value_record(t),
                                 cl.value_stride))
            << "value record " << t << " of page " << ids[k];
      }
    }
  }

  // Attention on the level pages, the window and the merge in the kernel's
  // launch: the float64 rule, and batch invariance (each item alone, the
  // whole batch again).
  DeviceBuffer pool;
  ASSERT_TRUE(pool.Upload(b.hot_pool));
  const int items = c.items();
  HotRun all;
  RunLevel(b, pool, 0, items, LevelMerge::kInLaunch, &all);
  if (::testing::Test::HasFatalFailure()) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const size_t qd = static_cast<size_t>(q_heads) * d;
  for (int i = 0; i < items; ++i) {
    CheckItem(all.out.data() + i * qd, all.lse[static_cast<size_t>(i) * q_heads], c.ref_keys[i], c.ref_values[i],
              c.tokens[i] + c.window_tokens[i], kv_heads, d, c.query.data() + i * qd, q_heads, scale, "level", i);
  }
  HotRun again;
  RunLevel(b, pool, 0, items, LevelMerge::kInLaunch, &again);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(0, std::memcmp(again.out.data(), all.out.data(), all.out.size() * 4)) << "second run differs";
  EXPECT_EQ(0, std::memcmp(again.lse.data(), all.lse.data(), all.lse.size() * 4)) << "second run lse differs";
  // The window and the merge as a second launch: the same bits, for the
  // batch and each item alone (kAuto picks either by the batch's size).
  HotRun two;
  RunLevel(b, pool, 0, items, LevelMerge::kSecondLaunch, &two);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(0, std::memcmp(two.out.data(), all.out.data(), all.out.size() * 4)) << "second launch differs";
  EXPECT_EQ(0, std::memcmp(two.lse.data(), all.lse.data(), all.lse.size() * 4)) << "second launch: lse differs";
  for (int i = 0; i < items; ++i) {
    for (LevelMerge m : {LevelMerge::kInLaunch, LevelMerge::kSecondLaunch}) {
      HotRun one;
      RunLevel(b, pool, i, 1, m, &one);
      if (::testing::Test::HasFatalFailure()) return;
      const char* how = m == LevelMerge::kInLaunch ? " (in the launch)" : " (second launch)";
      EXPECT_EQ(0, std::memcmp(one.out.data(), all.out.data() + i * qd, qd * 4))
          << "item " << i << " alone differs" << how;
      EXPECT_EQ(0, std::memcmp(one.lse.data(), all.lse.data() + static_cast<size_t>(i) * q_heads, q_heads * 4))
          << "item " << i << " alone: lse differs" << how;
    }
  }
}

TEST(LevelAttentionGpu, DequantisersExhaustive) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<int> bad = LevelDecodeSelfTest();
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(*bad, 0);
}

// The merge's block per KV head group against its block per query head:
// the same bits, with and without the rotation, for GQA 4 and 2, written
// to the rows or to output targets in device and pinned host memory.
TEST(LevelAttentionGpu, MergeGroupBlocksMatchPerHeadBlocks) {
  SKIP_WITHOUT_GPU();
  for (const auto& [q_heads, kv_heads, head_dim] : {std::tuple{32, 8, 128}, std::tuple{8, 4, 64}}) {
    for (bool rotated : {false, true}) {
      for (MergeTargets t : {kMergeTargetsNone, kMergeTargetsDevice, kMergeTargetsHost}) {
        absl::StatusOr<int64_t> differ = MergeKernelsDiffer(40, q_heads, kv_heads, head_dim, 5, rotated, t);
        ASSERT_TRUE(differ.ok()) << differ.status();
        EXPECT_EQ(*differ, 0) << q_heads << "/" << kv_heads << " x " << head_dim << (rotated ? " rotated" : "")
                              << " targets " << t;
      }
    }
  }
}

TEST(LevelAttentionGpu, Gqa32x8Dim128) {
  SKIP_WITHOUT_GPU();
  RunCase(8, 128, 32, {1, 97, 4095, 1024}, {0, 5, 128, 255}, 1);
}

TEST(LevelAttentionGpu, Gqa8x4Dim64) {
  SKIP_WITHOUT_GPU();
  RunCase(4, 64, 8, {97, 640, 1, 2048, 300, 129}, {3, 0, 128, 9, 64, 1}, 2);
}

TEST(LevelAttentionGpu, Gqa8x4Dim128AndGqa32x8Dim64) {
  SKIP_WITHOUT_GPU();
  RunCase(4, 128, 8, {700, 5}, {100, 0}, 3);
  RunCase(8, 64, 32, {250, 1, 1500}, {4, 0, 17}, 4);
}

TEST(LevelAttentionGpu, WindowOnlyAndEmpty) {
  SKIP_WITHOUT_GPU();
  RunCase(8, 128, 32, {0, 0, 5}, {5, 0, 0}, 5);
}

// A long sequence split many ways inside a batch of mixed lengths: every
// item alone equals itself in the batch.
TEST(LevelAttentionGpu, BatchInvarianceLong) {
  SKIP_WITHOUT_GPU();
  std::vector<int> tokens, window;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 12; ++i) {
    tokens.push_back(static_cast<int>(rng() % 9000));
    window.push_back(static_cast<int>(rng() % 256));
  }
  tokens[3] = 40000;
  RunCase(8, 128, 32, tokens, window, 6);
}

// Queries far from the usual scale: rotated elements past fp16's largest
// finite value (65504), where an unscaled fp16 split gives inf and NaN,
// and elements deep below fp16's normals. The query's power of two keeps
// both in range; the float64 rule holds at both ends.
TEST(LevelAttentionGpu, LargeAndTinyQueries) {
  SKIP_WITHOUT_GPU();
  RunCase(8, 128, 32, {1, 97, 1500}, {0, 5, 128}, 11, 3e5f);
  RunCase(4, 64, 8, {640, 3}, {9, 0}, 12, 3e5f);
  RunCase(8, 128, 32, {1, 97, 1500}, {0, 5, 128}, 13, 2e-7f);
  RunCase(4, 64, 8, {640, 3}, {9, 0}, 14, 2e-7f);
}

int SplitsOf(int pages) {
  const int per = LevelPagesPerSplit(pages);
  return (pages + per - 1) / per;
}

// The first length p (pages) with more splits than p + 1 (with 8-page
// splits up to 128 pages and about 16 splits beyond: 128 pages take 16
// splits, 129 take 15): the grid must cover the shorter item's splits too.
TEST(LevelAttentionGpu, ShorterItemWithMoreSplits) {
  SKIP_WITHOUT_GPU();
  int p = 1;
  while (p < 4096 && SplitsOf(p) <= SplitsOf(p + 1)) ++p;
  if (p == 4096) {
    GTEST_SKIP() << "no length up to 4096 pages has more splits than the next";
  }
  RunCase(4, 64, 8, {(p + 1) * 128, p * 128 - 5, 100}, {3, 0, 7}, 8);
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv

namespace driftkv {
namespace gpu {
namespace {

// A corrupt level page is reported with its first failing record, as the
// CPU's DemotePage refuses it; the other pages of the launch still demote.
TEST(LevelDemoteGpu, CorruptPagesNameTheirFirstBadRecord) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 2;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok()) << codec.status();
  HotBatch b;
  BuildHotBatch(*codec, 4, {3 * 128}, {0}, 77, &b);
  if (::testing::Test::HasFatalFailure()) return;
  const PageLayout& cl = b.cold.layout;
  std::vector<int32_t> ids, toks;
  for (size_t id = 0; id < b.page_tokens.size(); ++id) {
    if (b.page_tokens[id] > 0) ids.push_back(static_cast<int32_t>(id)), toks.push_back(b.page_tokens[id]);
  }
  ASSERT_EQ(ids.size(), 3u);
  std::vector<uint8_t> hot = b.hot_pool;
  // Page 0: value byte 255 (a base-6 digit of 7) in the first head's block;
  // page 1: token 5's key grid scale is infinite.
  uint8_t* p0 = hot.data() + static_cast<size_t>(ids[0]) * b.hot.page_bytes;
  p0[b.hot.value_block(0)] = 0xff;
  uint8_t* p1 = hot.data() + static_cast<size_t>(ids[1]) * b.hot.page_bytes;
  p1[4 * 5] = 0x00;
  p1[4 * 5 + 1] = 0x7c;
  std::vector<uint8_t> start(b.cold.pool.size(), 0), got;
  std::vector<int32_t> status;
  DemoteOnDevice(*codec, cl, b.hot, hot, start, ids, toks, &got, &status);
  if (::testing::Test::HasFatalFailure()) return;
  for (int k = 0; k < 2; ++k) {
    std::vector<uint8_t> page(cl.page_bytes);
    absl::Status st = DemotePage(*codec, b.hot, hot.data() + static_cast<size_t>(ids[k]) * b.hot.page_bytes, toks[k],
                                 page.data(), page.data() + cl.value_offset, page.data() + cl.mean_offset);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << "page " << k << ": " << st;
  }
  EXPECT_GT(status[0], 128) << "a value record fails (1 + 128 + token)";
  EXPECT_EQ(status[1], 1 + 5) << "key record of token 5";
  EXPECT_EQ(status[2], 0);
  const size_t off = static_cast<size_t>(ids[2]) * cl.page_bytes;
  EXPECT_EQ(0, std::memcmp(got.data() + off, b.cold.pool.data() + off, cl.mean_offset))
      << "the intact page demotes to its records";
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
