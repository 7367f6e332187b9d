// GPU attention kernels against the CPU references on fresh random inputs.
// Error rule (flash-attention's): ||gpu - ref64|| <= k * ||naive32 - ref64|| +
// floor * ||ref64||, where ref64 is float64 attention over exactly the values
// the kernel must see (decoded records and bf16 window) and naive32 a plain
// fp32 implementation over the same values. Outputs are poisoned (NaN) before
// every launch, so an unwritten element fails.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/testing/batch_builder.h"
#include "kernels/testing/device_buffer.h"
#include "kernels/testing/gpu_test_util.h"

namespace driftkv {
namespace gpu {
namespace {

const ::testing::Environment* const kErrorReport = ::testing::AddGlobalTestEnvironment(new WorstErrorReport);

struct DQuantCase {
  int kv_heads, head_dim, q_heads;
  std::vector<int> tokens, window;
  int splits;
  float query_scale = 1.0f;  // multiplies the random queries
};

void RunDQuantCase(const DQuantCase& c, uint64_t seed) {
  DQuantConfig cfg;
  cfg.kv_heads = c.kv_heads;
  cfg.head_dim = c.head_dim;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok()) << codec.status();
  HostDQuantBatch b;
  ASSERT_TRUE(BuildDQuantBatch(*codec, c.q_heads, c.tokens, c.window, /*shuffle=*/true, seed, &b).ok());
  for (float& x : b.query) x *= c.query_scale;
  const int items = b.items(), d = c.head_dim;
  std::vector<uint32_t> tables(512);
  PackDecodeTable(codec->key_codec().table(), tables.data());
  PackDecodeTable(codec->value_codec().table(), tables.data() + 256);
  DeviceBuffer pool, tab;
  ASSERT_TRUE(pool.Upload(b.pool) && tab.Upload(tables));
  DeviceItems dev;
  ASSERT_TRUE(dev.Upload(b, 0, items));
  DQuantAttentionParams p;
  p.batch = dev.batch();
  // Windows found by position (item i at i * kMaxWindow), not by start.
  p.batch.window_start_dev = nullptr;
  p.pool_dev = pool.get<uint8_t>();
  p.layout = b.layout;
  p.tables_dev = tab.get<uint32_t>();
  p.splits = c.splits;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  absl::Status st = LaunchDQuantAttention(p, stream);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  std::vector<float> h_out, h_lse;
  ASSERT_TRUE(dev.Download(&h_out, &h_lse));
  std::vector<float> cpu_out(static_cast<size_t>(c.q_heads) * d), cpu_lse(c.q_heads);
  for (int i = 0; i < items; ++i) {
    const float* go = h_out.data() + static_cast<size_t>(i) * c.q_heads * d;
    CheckItem(go, h_lse[static_cast<size_t>(i) * c.q_heads], b.ref_keys[i], b.ref_values[i],
              b.tokens[i] + b.window_tokens[i], c.kv_heads, d, b.query.data() + static_cast<size_t>(i) * c.q_heads * d,
              c.q_heads, p.batch.softmax_scale, "dquant", i);
    // And the CPU fused path of codec/compressed_attention.h agrees too,
    // for queries of the usual scale. Scaled by 3e5 the scores are ~3e5,
    // where fp32's rounding of a score (~0.03) moves the peaked softmax's
    // weights by percents: two fp32 paths then differ by more than this
    // bound (on an H100: 1.9e-4 against 2.1e-5 for 4095 tokens) while the
    // GPU's answer keeps the float64 rule above, which is what holds such
    // queries to account.
    if (c.query_scale != 1.0f) continue;
    ASSERT_TRUE(CpuCompressedAttention(*codec, b, i, p.batch.softmax_scale, cpu_out.data(), cpu_lse.data()).ok());
    double diff = 0.0, norm = 0.0;
    for (size_t j = 0; j < cpu_out.size(); ++j) {
      diff = std::max(diff, static_cast<double>(std::fabs(go[j] - cpu_out[j])));
      norm = std::max(norm, static_cast<double>(std::fabs(cpu_out[j])));
    }
    EXPECT_LE(diff, 1e-4 * (norm + 1e-3)) << "GPU vs CPU CompressedAttention, item " << i;
  }
}

TEST(DQuantAttentionGpu, Gqa32x8Dim128OddSizes) {
  SKIP_WITHOUT_GPU();
  RunDQuantCase({8, 128, 32, {1, 97, 4095}, {0, 5, 128}, 0}, 1);
  // The service's window reaches window_tokens + page_tokens - 1 = 255 tokens.
  RunDQuantCase({8, 128, 32, {97, 4095, 1}, {129, 255, 200}, 0}, 9);
  RunDQuantCase({8, 128, 32, {4095, 1}, {17, 0}, 1}, 2);  // one split: no merge
}

// Queries whose rotated elements pass fp16's largest finite value (an
// unscaled fp16 split gives inf and NaN) or sit deep below its normals.
TEST(DQuantAttentionGpu, LargeAndTinyQueries) {
  SKIP_WITHOUT_GPU();
  RunDQuantCase({8, 128, 32, {97, 4095}, {5, 128}, 0, 3e5f}, 21);
  RunDQuantCase({4, 64, 8, {640, 1}, {9, 0}, 0, 3e5f}, 22);
  RunDQuantCase({8, 128, 32, {97, 4095}, {5, 128}, 0, 2e-7f}, 23);
  RunDQuantCase({4, 64, 8, {640, 1}, {9, 0}, 0, 2e-7f}, 24);
}

TEST(DQuantAttentionGpu, Gqa8x4Dim64SeveralBatchSizes) {
  SKIP_WITHOUT_GPU();
  RunDQuantCase({4, 64, 8, {97}, {3}, 0}, 3);
  RunDQuantCase({4, 64, 8, {1, 97, 640, 1000, 129, 2048, 4095, 300}, {0, 1, 2, 128, 0, 64, 5, 9}, 0}, 4);
}

TEST(DQuantAttentionGpu, Gqa16x8Dim128AndGqa8x4Dim128) {
  SKIP_WITHOUT_GPU();
  RunDQuantCase({8, 128, 16, {513, 97}, {0, 7}, 0}, 5);
  RunDQuantCase({4, 128, 16, {700}, {100}, 3}, 6);
  RunDQuantCase({8, 64, 32, {250, 1}, {4, 0}, 0}, 7);
}

// Items [first, first + count) of a batch through the fused kernel with the
// launcher's own split choice; returns out and lse.
void RunDQuantItems(const DQuantCodec& codec, const HostDQuantBatch& b, const DeviceBuffer& pool, int first, int count,
                    std::vector<float>* h_out, std::vector<float>* h_lse) {
  std::vector<uint32_t> tables(512);
  PackDecodeTable(codec.key_codec().table(), tables.data());
  PackDecodeTable(codec.value_codec().table(), tables.data() + 256);
  DeviceBuffer tab;
  DeviceItems dev;
  ASSERT_TRUE(tab.Upload(tables) && dev.Upload(b, first, count));
  DQuantAttentionParams p;
  p.batch = dev.batch();
  p.pool_dev = pool.get<uint8_t>();
  p.layout = b.layout;
  p.tables_dev = tab.get<uint32_t>();
  absl::Status st = LaunchDQuantAttention(p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(dev.Download(h_out, h_lse));
}

// The cold kernel's answer for an item does not depend on what rides beside
// it: each item alone equals itself in a batch of mixed lengths, and a second
// run of the batch equals the first, bit for bit.
TEST(DQuantAttentionGpu, BatchInvariance) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok()) << codec.status();
  std::vector<int> tokens = {3000, 97, 9000, 1, 2500, 640, 0, 8300};
  std::vector<int> window = {128, 5, 255, 0, 17, 128, 3, 64};
  HostDQuantBatch b;
  ASSERT_TRUE(BuildDQuantBatch(*codec, 32, tokens, window, /*shuffle=*/true, 21, &b).ok());
  DeviceBuffer pool;
  ASSERT_TRUE(pool.Upload(b.pool));
  const size_t qd = static_cast<size_t>(b.q_heads) * cfg.head_dim;
  std::vector<float> out, lse, again_out, again_lse;
  RunDQuantItems(*codec, b, pool, 0, b.items(), &out, &lse);
  RunDQuantItems(*codec, b, pool, 0, b.items(), &again_out, &again_lse);
  EXPECT_EQ(0, std::memcmp(out.data(), again_out.data(), out.size() * 4)) << "second run differs";
  for (int i = 0; i < b.items(); ++i) {
    std::vector<float> one_out, one_lse;
    RunDQuantItems(*codec, b, pool, i, 1, &one_out, &one_lse);
    EXPECT_EQ(0, std::memcmp(one_out.data(), out.data() + i * qd, qd * 4)) << "item " << i << " alone differs";
    EXPECT_EQ(0, std::memcmp(one_lse.data(), lse.data() + static_cast<size_t>(i) * b.q_heads, b.q_heads * 4))
        << "item " << i << " alone: lse differs";
  }
}

TEST(DQuantAttentionGpu, WindowOnlyAndEmpty) {
  SKIP_WITHOUT_GPU();
  RunDQuantCase({8, 128, 32, {0, 0}, {5, 0}, 0}, 8);
}

void RunBf16Case(int kv_heads, int d, int q_heads, const std::vector<int>& tokens, int splits, uint64_t seed) {
  HostBf16Batch b;
  BuildBf16Batch(kv_heads, d, q_heads, tokens, /*shuffle=*/true, seed, &b);
  const int items = b.items();
  DeviceBuffer pool, pt, ps, tok, q, out, lse, ws;
  ASSERT_TRUE(pool.Upload(b.pool) && pt.Upload(b.page_table) && ps.Upload(b.page_start) && tok.Upload(b.tokens) &&
              q.Upload(b.query));
  ASSERT_TRUE(out.Resize(static_cast<size_t>(items) * q_heads * d * 4) &&
              lse.Resize(static_cast<size_t>(items) * q_heads * 4));
  ASSERT_TRUE(ws.Resize(AttentionWorkspaceBytes(items, q_heads, d, b.max_pages)));
  cudaMemset(out.get<void>(), 0xff, out.bytes());
  cudaMemset(lse.get<void>(), 0xff, lse.bytes());
  Bf16AttentionParams p;
  p.pool_dev = pool.get<uint8_t>();
  p.kv_heads = kv_heads;
  p.head_dim = d;
  p.items = items;
  p.q_heads = q_heads;
  p.max_pages = b.max_pages;
  p.page_table_dev = pt.get<int32_t>();
  p.page_start_dev = ps.get<int32_t>();
  p.tokens_dev = tok.get<int32_t>();
  p.query_dev = q.get<float>();
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.out_dev = out.get<float>();
  p.lse_dev = lse.get<float>();
  p.workspace_dev = ws.get<void>();
  p.splits = splits;
  absl::Status st = LaunchBf16Attention(p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> h_out, h_lse;
  ASSERT_TRUE(out.Download(&h_out) && lse.Download(&h_lse));
  for (int i = 0; i < items; ++i) {
    CheckItem(h_out.data() + static_cast<size_t>(i) * q_heads * d, h_lse[static_cast<size_t>(i) * q_heads],
              b.ref_keys[i], b.ref_values[i], b.tokens[i], kv_heads, d,
              b.query.data() + static_cast<size_t>(i) * q_heads * d, q_heads, p.softmax_scale, "bf16", i);
  }
}

TEST(Bf16AttentionGpu, OddSizesAndBatches) {
  SKIP_WITHOUT_GPU();
  RunBf16Case(8, 128, 32, {1, 97, 4095}, 0, 11);
  RunBf16Case(8, 128, 32, {4095}, 1, 12);
  RunBf16Case(4, 64, 8, {1, 97, 640, 1000, 129, 2048, 4095, 300}, 0, 13);
  RunBf16Case(8, 128, 16, {513, 97}, 3, 14);
  RunBf16Case(4, 64, 16, {200, 64}, 0, 15);
}

TEST(AttentionLaunchers, RejectUnsupportedShapes) {
  SKIP_WITHOUT_GPU();
  Bf16AttentionParams p;
  p.items = 1;
  p.kv_heads = 8;
  p.head_dim = 96;
  p.q_heads = 32;
  p.max_pages = 1;
  EXPECT_FALSE(LaunchBf16Attention(p, nullptr).ok());
  p.head_dim = 128;
  p.q_heads = 30;
  EXPECT_FALSE(LaunchBf16Attention(p, nullptr).ok());
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
