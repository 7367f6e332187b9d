// Shared helpers of the service tests: a small model shape, synthetic keys
// and values with the structure of real ones (per-channel key offsets, a
// few outlier channels), the requests built from them (Append chunks,
// Attend items), and the codec's own in-process pipeline as the yardstick
// the service must match. A handler with its metrics and clock is in
// tests/handler_fixture.h, an in-process server and client in
// tests/loopback_server.h.
#ifndef DRIFTKV_TESTS_SERVICE_TEST_UTIL_H_
#define DRIFTKV_TESTS_SERVICE_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/dquant_kv_codec.h"
#include "codec/kv_codec.h"
#include "eval/service_replay.h"
#include "eval/synthetic_kv.h"
#include "proto/driftkv.pb.h"
#include "service/config.h"
#include "wire/half.h"
#include "wire/tensor.h"

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

// A port of this host as a client's target (SmallOptions listens there).
inline std::string LoopbackTarget(int port) {
  return absl::StrCat("127.0.0.1:", port);
}

// SmallOptions' n = kv_heads x head_dim: the floats of one token's keys.
constexpr int kSmallN = 128;

// Keys and values [tokens][n] of one layer of n / 64 KV heads x 64 from the
// synthetic generator (eval/synthetic_kv.h, kind "llm"): per-channel key
// means with outlier channels and RoPE, but even token norms, no attention
// sink and near-Gaussian values, so that the tests' error bounds measure
// the service rather than the data's tails. Deterministic for a seed.
// REQUIRES: n a multiple of 64.
struct Kv {
  std::vector<float> keys, values;
};
inline Kv SyntheticKv(int tokens, int n, uint32_t seed) {
  SynthParams p;
  p.layers = 1;
  p.tokens = tokens;
  p.kv_heads = n / 64;
  p.head_dim = 64;
  p.query_tokens = 0;
  p.seed = seed;
  p.token_norm_sigma = 0.0;
  p.sink_scale = 1.0;
  p.channel_spread = 0.0;
  p.value_dof = 30.0;
  SynthKv s = GenerateSynth(p);
  return Kv{std::move(s.keys), std::move(s.values)};
}

inline std::vector<float> SyntheticQuery(int q_heads, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(q_heads) * d);
  for (float& x : q) x = g(rng);
  return q;
}

// One Append chunk of `count` tokens [count][n] from `keys`/`values`,
// converted to `dtype`, numbered from `first`. No crc32c: the handler is
// given what the test built (client/client.h MakeChunk sets one).
inline v1::AppendChunk ChunkOfRows(const std::string& seq, uint32_t layer, uint64_t first, uint32_t count,
                                   const float* keys, const float* values, size_t n, v1::DType dtype = v1::DTYPE_F32) {
  v1::AppendChunk c;
  c.set_sequence_id(seq);
  c.set_layer(layer);
  c.set_first_token(first);
  c.set_token_count(count);
  c.set_dtype(dtype);
  FloatToTensor(keys, static_cast<size_t>(count) * n, dtype, c.mutable_keys());
  FloatToTensor(values, static_cast<size_t>(count) * n, dtype, c.mutable_values());
  return c;
}

// Tokens [first, first + count) of `kv` (rows of kSmallN) as one chunk.
inline v1::AppendChunk ChunkOf(const std::string& seq, uint32_t layer, uint64_t first, uint32_t count, const Kv& kv,
                               v1::DType dtype = v1::DTYPE_F32) {
  const size_t at = static_cast<size_t>(first) * kSmallN;
  return ChunkOfRows(seq, layer, first, count, kv.keys.data() + at, kv.values.data() + at, kSmallN, dtype);
}

// One Attend item for query `q` [q_heads][head_dim], converted to `dtype`.
inline v1::AttendItem QueryItem(const std::string& seq, uint32_t layer, const std::vector<float>& q, int q_heads,
                                v1::DType dtype = v1::DTYPE_F32) {
  v1::AttendItem it;
  it.set_sequence_id(seq);
  it.set_layer(layer);
  it.set_dtype(dtype);
  it.set_q_heads(q_heads);
  FloatToTensor(q.data(), q.size(), dtype, it.mutable_query());
  return it;
}

inline std::vector<float> RoundBf16(const float* x, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(FloatToBf16(x[i]));
  return out;
}

// The D-Quant codec a handler serves with (its codec is "dquant").
inline const DQuantCodec& DQuantOf(const KvCodec& codec) {
  return static_cast<const DQuantKvCodec&>(codec).codec();
}

// The service's storage rule replayed with the codec alone
// (eval/service_replay.h) for tokens [0, tokens) of one layer. Returns
// attention output [q_heads][d] and lse (empty on an error).
struct Attention {
  std::vector<float> out, lse;
};
inline Attention CodecPipeline(const DQuantCodec& codec, const float* keys, const float* values, int tokens,
                               int window_tokens, const float* query, int q_heads, float scale) {
  absl::StatusOr<ServiceReplay> replay = ServiceReplay::Encode(codec, window_tokens, keys, values, tokens);
  if (!replay.ok()) return {};
  Attention a;
  a.out.resize(static_cast<size_t>(q_heads) * codec.config().head_dim);
  a.lse.resize(q_heads);
  AttentionScratch as;
  if (!replay->Attend(tokens, query, q_heads, scale, a.out.data(), a.lse.data(), &as).ok()) return {};
  return a;
}

// Relative L2 error of `out` against the float64 reference attention over
// the original float keys/values.
inline double RelativeError(const std::vector<float>& out, const float* keys, const float* values, int tokens,
                            int kv_heads, int d, const float* query, int q_heads, double scale) {
  std::vector<double> ref(static_cast<size_t>(q_heads) * d), lse(q_heads);
  ReferenceAttention(keys, values, tokens, kv_heads, d, query, q_heads, scale, ref.data(), lse.data());
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
