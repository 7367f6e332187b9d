// Sequences of the production shape for the level benchmarks (8 KV heads
// x 128, GQA 32/8, pages of 128 tokens): appended through a Handler from a
// few bf16 patterns, attended in every layer, their answers as bytes.
#ifndef DRIFTKV_BENCH_LEVEL_BENCH_UTIL_H_
#define DRIFTKV_BENCH_LEVEL_BENCH_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/bf16_pattern.h"
#include "bench/check.h"
#include "service/handler.h"

namespace driftkv {
namespace bench {

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD, kQHeads = 32, kPageTokens = 128;

// A handler of that shape on `backend` with `layers` layers, no metrics
// port; the caller sets the pool and the levels.
inline ServiceOptions LevelServiceOptions(const std::string& backend, int layers) {
  ServiceOptions o;
  o.metrics_listen = "";
  o.backend = backend;
  o.layers = layers;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kPageTokens;
  o.window_tokens = kPageTokens;
  return o;
}

// Appends `tokens` to every layer of `id`. Sequence `seed`'s layer l is
// pattern (l + seed) mod layers: distinct sequences without generating
// 0.5 G values for each.
inline absl::Status LevelAdd(Handler& h, const std::string& id, int layers, int tokens, uint32_t seed) {
  static std::vector<std::string> keys, values;
  if (keys.empty()) {
    for (int l = 0; l < layers; ++l) {
      keys.push_back(Bf16Pattern(static_cast<size_t>(tokens) * kN, 2 * l * 7919));
      values.push_back(Bf16Pattern(static_cast<size_t>(tokens) * kN, 2 * l * 7919 + 1));
    }
  }
  v1::AppendResponse r;
  for (int l = 0; l < layers; ++l) {
    const int pattern = static_cast<int>((static_cast<uint32_t>(l) + seed) % static_cast<uint32_t>(layers));
    v1::AppendChunk c;
    c.set_sequence_id(id);
    c.set_layer(l);
    c.set_token_count(tokens);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(keys[pattern]);
    c.set_values(values[pattern]);
    if (absl::Status st = h.Append(c, &r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// One item per layer of `id`, f32 queries of kQHeads heads.
inline v1::AttendRequest AttendAll(const std::string& id, int layers) {
  v1::AttendRequest req;
  for (int l = 0; l < layers; ++l) {
    v1::AttendItem* it = req.add_items();
    it->set_sequence_id(id);
    it->set_layer(l);
    it->set_q_heads(kQHeads);
    std::string q(static_cast<size_t>(kQHeads) * kD * 4, '\0');
    uint32_t s = 977u * static_cast<uint32_t>(l) + 5;
    for (size_t i = 0; i < q.size() / 4; ++i) {
      s = s * 1664525u + 1013904223u;
      const float f = static_cast<float>(static_cast<int32_t>(s >> 8) % 2000) / 1000.0f - 1.0f;
      std::memcpy(&q[i * 4], &f, 4);
    }
    it->set_query(q);
    it->set_dtype(v1::DTYPE_F32);
  }
  return req;
}

// Every layer attended, then layer 0 read: the answer's bytes.
inline std::string LevelAnswers(Handler& h, const std::string& id, int layers) {
  v1::AttendResponse resp;
  CHECK_OK(h.Attend(AttendAll(id, layers), &resp));
  std::string out;
  for (const v1::AttendResult& r : resp.results()) {
    out += r.output();
    out.append(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * 4);
  }
  v1::ReadRequest q;
  q.set_sequence_id(id);
  q.set_dtype(v1::DTYPE_BF16);
  CHECK_OK(h.Read(q, [&](const v1::ReadChunk& c) {
    out += c.keys();
    out += c.values();
    return true;
  }));
  return out;
}

}  // namespace bench
}  // namespace driftkv

#endif  // DRIFTKV_BENCH_LEVEL_BENCH_UTIL_H_
