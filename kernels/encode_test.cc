// GPU encode against the CPU codec: every GPU record decodes on the CPU
// (valid stream, fits its container) to exactly the values the GPU decoder
// gives, CPU records decode identically on the GPU, mean records are the
// CPU's, and encode quality (NMSE, bytes used) matches the CPU encoder.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "codec/dquant_codec.h"
#include "codec/hadamard.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/encode.h"
#include "kernels/testing/batch_builder.h"
#include "kernels/testing/device_buffer.h"
#include "kernels/testing/gpu_test_util.h"

namespace driftkv {
namespace gpu {
namespace {

struct Pools {
  std::vector<uint8_t> gpu_pool, cpu_pool;
};

// NMSE of decoded (model domain) vs input, over all tokens, keys and values.
void Nmse(const DQuantCodec& codec, const PageLayout& lay, const std::vector<uint8_t>& pool, int tokens,
          const std::vector<float>& keys, const std::vector<float>& values, double* nk, double* nv) {
  const int n = lay.n();
  CodecScratch scratch;
  std::vector<float> out(n);
  double ek = 0, sk = 0, ev = 0, sv = 0;
  for (int t = 0; t < tokens; ++t) {
    const uint8_t* page = pool.data() + static_cast<size_t>(t / kPageTokens) * lay.page_bytes;
    const int slot = t % kPageTokens;
    ASSERT_TRUE(codec.DecodeKey(page + slot * lay.key_stride, page + lay.mean_offset, out.data(), &scratch).ok())
        << "key " << t;
    for (int j = 0; j < n; ++j) {
      const double x = keys[static_cast<size_t>(t) * n + j];
      ek += (out[j] - x) * (out[j] - x);
      sk += x * x;
    }
    ASSERT_TRUE(codec.DecodeValue(page + lay.value_offset + slot * lay.value_stride, out.data(), &scratch).ok())
        << "value " << t;
    for (int j = 0; j < n; ++j) {
      const double x = values[static_cast<size_t>(t) * n + j];
      ev += (out[j] - x) * (out[j] - x);
      sv += x * x;
    }
  }
  *nk = ek / sk;
  *nv = ev / sv;
}

void RunEncodeCase(int kv_heads, int head_dim, int tokens, uint64_t seed, Refit value_refit = kDefaultValueRefit) {
  DQuantConfig cfg;
  cfg.kv_heads = kv_heads;
  cfg.head_dim = head_dim;
  cfg.value_refit = value_refit;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok()) << codec.status();
  EncodeParams ep;
  ASSERT_TRUE(MakeEncodeAlphabets(*codec, &ep).ok());
  const PageLayout lay = ep.layout;
  const int n = lay.n(), pages = (tokens + kPageTokens - 1) / kPageTokens;
  std::mt19937_64 rng(seed);
  std::vector<float> keys, values;
  RandomKv(tokens, kv_heads, head_dim, &rng, &keys, &values);

  // CPU pool (pages in order).
  std::vector<uint8_t> cpu_pool(static_cast<size_t>(pages) * lay.page_bytes, 0);
  CodecScratch scratch;
  StreamStats cpu_stats[2];
  for (int w = 0; w < pages; ++w) {
    const int count = std::min(kPageTokens, tokens - w * kPageTokens);
    uint8_t* page = cpu_pool.data() + static_cast<size_t>(w) * lay.page_bytes;
    StreamStats& ks = cpu_stats[0];
    StreamStats& vs = cpu_stats[1];
    ASSERT_TRUE(codec
                    ->EncodeWindow(keys.data() + static_cast<size_t>(w) * kPageTokens * n,
                                   values.data() + static_cast<size_t>(w) * kPageTokens * n, count, page,
                                   page + lay.value_offset, page + lay.mean_offset, &scratch, &ks, &vs)
                    .ok());
  }

  std::vector<int32_t> page_ids(pages);
  for (int i = 0; i < pages; ++i) page_ids[i] = i;
  DeviceBuffer dk, dv, dpages, dpool, dstats, dcpu_pool, dtables, dout, dok;
  ASSERT_TRUE(dk.Upload(keys) && dv.Upload(values) && dpages.Upload(page_ids));
  ASSERT_TRUE(dpool.Resize(cpu_pool.size()) && dstats.Resize(sizeof(EncodeStreamStats) * 2 * tokens));
  cudaMemset(dpool.get<void>(), 0xa5, dpool.bytes());  // poison: every byte of a record must be written
  ep.keys_dev = dk.get<float>();
  ep.values_dev = dv.get<float>();
  ep.tokens = tokens;
  ep.pages_dev = dpages.get<int32_t>();
  ep.pool_dev = dpool.get<uint8_t>();
  ep.stats_dev = dstats.get<EncodeStreamStats>();
  absl::Status st = LaunchEncode(ep, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> gpu_pool;
  ASSERT_TRUE(dpool.Download(&gpu_pool));
  std::vector<EncodeStreamStats> stats(2 * tokens);
  ASSERT_EQ(
      cudaMemcpy(stats.data(), dstats.get<void>(), stats.size() * sizeof(EncodeStreamStats), cudaMemcpyDeviceToHost),
      cudaSuccess);
  int64_t moved[2] = {0, 0}, constant[2] = {0, 0};
  int max_move[2] = {0, 0};
  for (int s = 0; s < 2 * tokens; ++s) {
    ASSERT_EQ(stats[s].error, 0) << "stream " << s;
    ASSERT_LE(stats[s].bytes_used, s % 2 == 0 ? lay.key_stride - 4 : lay.value_stride - 4);
    moved[s % 2] += stats[s].moved;
    constant[s % 2] += stats[s].constant;
    max_move[s % 2] = std::max<int>(max_move[s % 2], stats[s].max_move);
  }
  // Drift statistics (the service's metrics) agree with the CPU encoder's:
  // the encoders make the same decisions up to float rounding in the refit.
  for (int k = 0; k < 2; ++k) {
    std::printf("%s: moved gpu %lld cpu %lld, max move %d / %d, constant %lld / %lld\n", k == 0 ? "keys" : "values",
                static_cast<long long>(moved[k]), static_cast<long long>(cpu_stats[k].moved), max_move[k],
                cpu_stats[k].max_move, static_cast<long long>(constant[k]),
                static_cast<long long>(cpu_stats[k].constant));
    EXPECT_LE(std::abs(moved[k] - cpu_stats[k].moved), 0.02 * cpu_stats[k].moved + 8);
    EXPECT_LE(std::abs(max_move[k] - cpu_stats[k].max_move), 1);
    EXPECT_EQ(constant[k], cpu_stats[k].constant);
  }

  // Records equal the CPU's, byte for byte (same decisions, same rounding).
  int differing = 0;
  for (int t = 0; t < tokens; ++t) {
    const size_t page = static_cast<size_t>(t / kPageTokens) * lay.page_bytes;
    const int slot = t % kPageTokens;
    differing += std::memcmp(gpu_pool.data() + page + slot * lay.key_stride,
                             cpu_pool.data() + page + slot * lay.key_stride, lay.key_stride) != 0;
    differing +=
        std::memcmp(gpu_pool.data() + page + lay.value_offset + slot * lay.value_stride,
                    cpu_pool.data() + page + lay.value_offset + slot * lay.value_stride, lay.value_stride) != 0;
  }
  EXPECT_EQ(differing, 0) << "records differing from the CPU encoder's, of " << 2 * tokens;

  // Mean records equal the CPU's.
  for (int w = 0; w < pages; ++w) {
    const size_t off = static_cast<size_t>(w) * lay.page_bytes + lay.mean_offset;
    EXPECT_EQ(0, std::memcmp(gpu_pool.data() + off, cpu_pool.data() + off, lay.mean_stride))
        << "mean record of window " << w;
  }

  // Cross-decoding: GPU decoder on both pools vs the CPU decoder.
  std::vector<uint32_t> tables(512);
  PackDecodeTable(codec->key_codec().table(), tables.data());
  PackDecodeTable(codec->value_codec().table(), tables.data() + 256);
  ASSERT_TRUE(dtables.Upload(tables) && dcpu_pool.Upload(cpu_pool));
  ASSERT_TRUE(dout.Resize(sizeof(float) * 2 * tokens * n) && dok.Resize(sizeof(int32_t) * 2 * tokens));
  for (int which = 0; which < 2; ++which) {
    const std::vector<uint8_t>& pool = which == 0 ? gpu_pool : cpu_pool;
    DecodeRecordsParams dp;
    dp.layout = lay;
    dp.pool_dev = which == 0 ? dpool.get<uint8_t>() : dcpu_pool.get<uint8_t>();
    dp.pages_dev = dpages.get<int32_t>();
    dp.tokens = tokens;
    dp.tables_dev = dtables.get<uint32_t>();
    dp.key_payload = codec->key_codec().payload_bytes();
    dp.value_payload = codec->value_codec().payload_bytes();
    dp.out_dev = dout.get<float>();
    dp.ok_dev = dok.get<int32_t>();
    cudaMemset(dout.get<void>(), 0xff, dout.bytes());
    ASSERT_TRUE(LaunchDecodeRecords(dp, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> gout;
    std::vector<int32_t> gok;
    ASSERT_TRUE(dout.Download(&gout) && dok.Download(&gok));
    std::vector<float> cpu(n), mu(n);
    int mismatches = 0;
    for (int t = 0; t < tokens; ++t) {
      const uint8_t* page = pool.data() + static_cast<size_t>(t / kPageTokens) * lay.page_bytes;
      const int slot = t % kPageTokens;
      DQuantCodec::LoadMean(page + lay.mean_offset, n, mu.data());
      for (int kind = 0; kind < 2; ++kind) {
        const StreamCodec& sc = kind == 0 ? codec->key_codec() : codec->value_codec();
        const uint8_t* rec =
            kind == 0 ? page + slot * lay.key_stride : page + lay.value_offset + slot * lay.value_stride;
        ASSERT_TRUE(sc.Decode(rec, cpu.data()).ok())
            << (which == 0 ? "GPU" : "CPU") << " record of token " << t << " kind " << kind;
        ASSERT_EQ(gok[2 * t + kind], 1) << "GPU decoder rejects token " << t << " kind " << kind;
        // Trailing record bytes are zero (payload tail and padding).
        const int stride = kind == 0 ? lay.key_stride : lay.value_stride;
        const int used = which == 0 ? stats[2 * t + kind].bytes_used : 0;
        for (int i = 4 + used; which == 0 && i < stride; ++i) ASSERT_EQ(rec[i], 0) << "byte " << i << " token " << t;
        for (int j = 0; j < n; ++j) {
          const float want = kind == 0 ? cpu[j] + mu[j] : cpu[j];
          const float got = gout[(static_cast<size_t>(2 * t + kind)) * n + j];
          mismatches += std::memcmp(&want, &got, 4) != 0;
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << (which == 0 ? "GPU" : "CPU") << " records: GPU and CPU decoders disagree";
  }

  // Quality matches the CPU encoder.
  double gk, gv, ck, cv;
  Nmse(*codec, lay, gpu_pool, tokens, keys, values, &gk, &gv);
  Nmse(*codec, lay, cpu_pool, tokens, keys, values, &ck, &cv);
  std::printf("NMSE keys GPU %.6g CPU %.6g; values GPU %.6g CPU %.6g\n", gk, ck, gv, cv);
  EXPECT_NEAR(gk, ck, 0.03 * ck);
  EXPECT_NEAR(gv, cv, 0.03 * cv);
}

// A lone outlier of 30000 among zeros, no rotation (as behind a WUSH
// transform): drift moves the outlier inwards and the refit must pin the
// origin at the fp16 limit exactly as the CPU encoder does
// (stream_codec_test SingleHugeOutlierDegradesGracefully).
TEST(EncodeGpu, LoneOutlierPinsTheOriginLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  cfg.hadamard = false;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  EncodeParams ep;
  ASSERT_TRUE(MakeEncodeAlphabets(*codec, &ep).ok());
  ep.rotate = false;
  const PageLayout lay = ep.layout;
  const int n = lay.n(), tokens = 2;
  std::vector<float> keys(tokens * n, 0.0f), values(tokens * n, 0.0f);
  keys[17] = 30000.0f;
  values[17] = 30000.0f;
  values[n + 900] = -30000.0f;
  std::vector<uint8_t> cpu_pool(lay.page_bytes, 0);
  CodecScratch scratch;
  StreamStats ks, vs;
  ASSERT_TRUE(codec
                  ->EncodeWindow(keys.data(), values.data(), tokens, cpu_pool.data(),
                                 cpu_pool.data() + lay.value_offset, cpu_pool.data() + lay.mean_offset, &scratch, &ks,
                                 &vs)
                  .ok());
  std::vector<int32_t> ids = {0};
  DeviceBuffer dk, dv, dpages, dpool;
  ASSERT_TRUE(dk.Upload(keys) && dv.Upload(values) && dpages.Upload(ids) && dpool.Resize(lay.page_bytes));
  cudaMemset(dpool.get<void>(), 0, dpool.bytes());
  ep.keys_dev = dk.get<float>();
  ep.values_dev = dv.get<float>();
  ep.tokens = tokens;
  ep.pages_dev = dpages.get<int32_t>();
  ep.pool_dev = dpool.get<uint8_t>();
  ASSERT_TRUE(LaunchEncode(ep, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> gpu_pool;
  ASSERT_TRUE(dpool.Download(&gpu_pool));
  for (int t = 0; t < tokens; ++t) {
    EXPECT_EQ(0,
              std::memcmp(gpu_pool.data() + t * lay.key_stride, cpu_pool.data() + t * lay.key_stride, lay.key_stride))
        << "key record " << t;
    EXPECT_EQ(0, std::memcmp(gpu_pool.data() + lay.value_offset + t * lay.value_stride,
                             cpu_pool.data() + lay.value_offset + t * lay.value_stride, lay.value_stride))
        << "value record " << t;
  }
  std::vector<float> y(n);
  ASSERT_TRUE(codec->DecodeValue(gpu_pool.data() + lay.value_offset, y.data(), &scratch).ok());
  EXPECT_GT(y[17], 15000.0f);
  for (int i = 0; i < n; ++i) {
    if (i != 17) {
      ASSERT_LE(std::fabs(y[i]), 300.0f) << i;
    }
  }
}

TEST(EncodeGpu, OddSizesGqa8x128) {
  SKIP_WITHOUT_GPU();
  RunEncodeCase(8, 128, 1, 21);
  RunEncodeCase(8, 128, 97, 22);
  RunEncodeCase(8, 128, 300, 23);
}

// Every value grid refit (codec/final_grid.h) gives the CPU's records.
TEST(EncodeGpu, EveryValueRefitLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  for (Refit r : {Refit::kLeastSquares, Refit::kUnbiased, Refit::kNormPreserving}) {
    SCOPED_TRACE(RefitName(r));
    RunEncodeCase(8, 128, 300, 26, r);
  }
}

TEST(EncodeGpu, Dim64AndSmallStreams) {
  SKIP_WITHOUT_GPU();
  RunEncodeCase(4, 64, 129, 24);
  RunEncodeCase(1, 64, 200, 25);
}

TEST(EncodeGpu, ConstantStreamsFit) {
  SKIP_WITHOUT_GPU();
  // A constant window: scale 0 streams, one-symbol payloads.
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  EncodeParams ep;
  ASSERT_TRUE(MakeEncodeAlphabets(*codec, &ep).ok());
  const int n = ep.layout.n(), tokens = 5;
  std::vector<float> keys(static_cast<size_t>(tokens) * n, 0.25f), values(keys.size(), -1.0f);
  std::vector<int32_t> pages = {0};
  DeviceBuffer dk, dv, dp, dpool;
  ASSERT_TRUE(dk.Upload(keys) && dv.Upload(values) && dp.Upload(pages) && dpool.Resize(ep.layout.page_bytes));
  ep.keys_dev = dk.get<float>();
  ep.values_dev = dv.get<float>();
  ep.tokens = tokens;
  ep.pages_dev = dp.get<int32_t>();
  ep.pool_dev = dpool.get<uint8_t>();
  ASSERT_TRUE(LaunchEncode(ep, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> pool;
  ASSERT_TRUE(dpool.Download(&pool));
  CodecScratch scratch;
  std::vector<float> out(n);
  for (int t = 0; t < tokens; ++t) {
    ASSERT_TRUE(
        codec->DecodeValue(pool.data() + ep.layout.value_offset + t * ep.layout.value_stride, out.data(), &scratch)
            .ok());
    std::vector<float> want(n, -1.0f);
    HadamardHeads(want.data(), 8, 128);
    // Decoded values are model-domain: H(o) with o = fp16(rotated value).
    for (int j = 0; j < n; ++j) EXPECT_NEAR(out[j], -1.0f, 2e-2f) << j;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
