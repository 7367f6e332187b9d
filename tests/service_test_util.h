// Shared helpers of the service tests: a small model shape, synthetic keys
// and values with the structure of real ones (per-channel key offsets, a
// few outlier channels), and the codec's own in-process pipeline as the
// yardstick the service must match.
#ifndef DRIFTKV_TESTS_SERVICE_TEST_UTIL_H_
#define DRIFTKV_TESTS_SERVICE_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "codec/attention.h"
#include "codec/dquant_codec.h"
#include "codec/half.h"
#include "service/config.h"

namespace driftkv {
namespace testing {

// 2 layers x 2 KV heads x 64: n = 128, fast to encode; pages of 32 tokens and
// a window of 32 so that a few hundred tokens already fill several pages.
inline ServiceOptions SmallOptions(uint64_t pool_pages_bytes = 8u << 20) {
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.layers = 2;
  o.codec.kv_heads = 2;
  o.codec.head_dim = 64;
  o.codec.mean_window = 32;
  o.window_tokens = 32;
  o.pool_bytes = pool_pages_bytes;
  o.max_sequences = 64;
  o.read_chunk_tokens = 64;  // Reads of a few hundred tokens span several messages
  return o;
}

// Keys: per-channel offsets plus Gaussian noise, channel 3 of each head an
// outlier; values: Gaussian. [tokens][n], deterministic for a seed.
struct Kv {
  std::vector<float> keys, values;
};
inline Kv SyntheticKv(int tokens, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> offset(n);
  for (int j = 0; j < n; ++j) offset[j] = 0.5f * g(rng) + (j % 64 == 3 ? 6.0f : 0.0f);
  Kv kv;
  kv.keys.resize(static_cast<size_t>(tokens) * n);
  kv.values.resize(kv.keys.size());
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < n; ++j) {
      kv.keys[t * n + j] = offset[j] + g(rng);
      kv.values[t * n + j] = 0.8f * g(rng);
    }
  }
  return kv;
}

inline std::vector<float> SyntheticQuery(int q_heads, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(q_heads) * d);
  for (float& x : q) x = g(rng);
  return q;
}

inline std::vector<float> RoundBf16(const float* x, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(FloatToBf16(x[i]));
  return out;
}

// The service's storage rule replayed with the codec alone: tokens [0, tokens)
// of one layer, full pages of P below the window, the newest ones in bf16.
// Returns attention output [q_heads][d] and lse.
struct Attention {
  std::vector<float> out, lse;
};
inline Attention CodecPipeline(const DQuantCodec& codec, const float* keys, const float* values,
                               int tokens, int window_tokens, const float* query, int q_heads,
                               float scale) {
  const int n = codec.n(), p = codec.config().mean_window;
  const int pages = tokens >= window_tokens + p ? (tokens - window_tokens) / p : 0;
  const std::vector<float> k = RoundBf16(keys, static_cast<size_t>(tokens) * n);
  const std::vector<float> v = RoundBf16(values, static_cast<size_t>(tokens) * n);
  std::vector<uint8_t> kr(static_cast<size_t>(pages) * p * codec.key_stride());
  std::vector<uint8_t> vr(static_cast<size_t>(pages) * p * codec.value_stride());
  std::vector<uint8_t> mr(static_cast<size_t>(pages) * codec.mean_stride());
  CodecScratch scratch;
  StreamStats ks, vs;
  std::vector<CompressedBlock> blocks;
  for (int i = 0; i < pages; ++i) {
    absl::Status st = codec.EncodeWindow(
        k.data() + static_cast<size_t>(i) * p * n, v.data() + static_cast<size_t>(i) * p * n, p,
        kr.data() + static_cast<size_t>(i) * p * codec.key_stride(),
        vr.data() + static_cast<size_t>(i) * p * codec.value_stride(),
        mr.data() + i * codec.mean_stride(), &scratch, &ks, &vs);
    if (!st.ok()) return {};
    blocks.push_back({kr.data() + static_cast<size_t>(i) * p * codec.key_stride(),
                      vr.data() + static_cast<size_t>(i) * p * codec.value_stride(),
                      mr.data() + i * codec.mean_stride(), p});
  }
  const int w = tokens - pages * p;
  std::vector<uint16_t> wk(static_cast<size_t>(w) * n), wv(wk.size());
  for (size_t i = 0; i < wk.size(); ++i) {
    wk[i] = FloatToBf16(keys[static_cast<size_t>(pages) * p * n + i]);
    wv[i] = FloatToBf16(values[static_cast<size_t>(pages) * p * n + i]);
  }
  Attention a;
  a.out.resize(static_cast<size_t>(q_heads) * codec.config().head_dim);
  a.lse.resize(q_heads);
  AttentionScratch as;
  if (!CompressedAttention(codec, blocks, Bf16Tokens{wk.data(), wv.data(), w}, query, q_heads,
                           scale, a.out.data(), a.lse.data(), &as)
           .ok()) {
    return {};
  }
  return a;
}

// Relative L2 error of `out` against the float64 reference attention over
// the original float keys/values.
inline double RelativeError(const std::vector<float>& out, const float* keys, const float* values,
                            int tokens, int kv_heads, int d, const float* query, int q_heads,
                            double scale) {
  std::vector<double> ref(static_cast<size_t>(q_heads) * d), lse(q_heads);
  ReferenceAttention(keys, values, tokens, kv_heads, d, query, q_heads, scale, ref.data(),
                     lse.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_SERVICE_TEST_UTIL_H_
