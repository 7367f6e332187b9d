// The Handler the data-plane fuzz targets answer with: CPU backend, 2
// layers of 1 KV head x 64, a 64 KiB pool, and sequence "s" holding
// kFuzzTokens tokens on both layers, so that an Attend of "s" with q_heads
// 1 or 2 succeeds and reaches the kernels. Rebuilt every 4096 uses so that
// what the inputs append stays small.
#ifndef DRIFTKV_FUZZ_FUZZ_HANDLER_H_
#define DRIFTKV_FUZZ_FUZZ_HANDLER_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "service/handler.h"

namespace driftkv {
namespace fuzz {

constexpr int kFuzzTokens = 40;

// The small handler every handler-level fuzz target runs: one KV head of
// 64, pages of 16 tokens, a 64 KiB pool.
inline ServiceOptions FuzzOptions() {
  ServiceOptions o;
  o.layers = 2;
  o.codec.kv_heads = 1;
  o.codec.head_dim = 64;
  o.codec.mean_window = 16;
  o.window_tokens = 8;
  o.pool_bytes = 64 << 10;
  o.max_sequences = 16;
  o.max_batch = 16;
  o.read_chunk_tokens = 32;
  o.backend_threads = 1;
  return o;
}

// Appends `tokens` tokens to sequence `id` on both layers, every key the
// bf16 bytes key_byte twice and every value value_byte twice (with token
// ids *first_id, *first_id + 1, ... where first_id is not null;
// new_incarnation: the id may be one released before); traps if the
// handler refuses.
inline void AppendBothLayers(Handler& h, const std::string& id, int tokens, char key_byte, char value_byte,
                             const uint32_t* first_id = nullptr, bool new_incarnation = false) {
  for (uint32_t layer = 0; layer < 2; ++layer) {
    v1::AppendChunk c;
    c.set_sequence_id(id);
    c.set_new_incarnation(new_incarnation);
    c.set_layer(layer);
    c.set_token_count(tokens);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(std::string(tokens * 64 * 2, key_byte));
    c.set_values(std::string(tokens * 64 * 2, value_byte));
    if (first_id != nullptr) {
      for (int i = 0; i < tokens; ++i) c.add_token_ids(*first_id + i);
    }
    v1::AppendResponse r;
    if (!h.Append(c, &r).ok()) __builtin_trap();
  }
}

// How many handlers FreshHandler has built: a new one may take the old
// one's address, so a target tells them apart by this.
inline int& HandlerGeneration() {
  static int generation = 0;
  return generation;
}

inline Handler& FreshHandler() {
  static std::unique_ptr<Metrics> metrics;
  static std::unique_ptr<Handler> handler;
  static int uses = 0;
  if (handler == nullptr || ++uses % 4096 == 0) {
    ++HandlerGeneration();
    handler.reset();
    metrics = std::make_unique<Metrics>();
    const ServiceOptions o = FuzzOptions();
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, metrics.get());
    if (!h.ok()) std::abort();
    handler = *std::move(h);
    AppendBothLayers(*handler, "s", kFuzzTokens, '\x3c', '\x3b');
  }
  return *handler;
}

// The handler's counts, for the targets' checks that a refused request
// changed nothing.
inline v1::StatsResponse StatsOf(Handler& h) {
  v1::StatsResponse s;
  h.Stats(&s);
  return s;
}

constexpr int kIdTokens = 48;

// Appends kIdTokens tokens with token ids first_id, first_id + 1, ... to
// sequence `id` on both layers, so that the prefix index holds its whole
// pages (new_incarnation: the id may be one released before); traps if
// the handler refuses.
inline void AppendWithIds(Handler& h, const std::string& id, uint32_t first_id, bool new_incarnation = false) {
  AppendBothLayers(h, id, kIdTokens, '\x3d', '\x3a', &first_id, new_incarnation);
}

// Sequence `id` with token ids 0, 1, ... (AppendWithIds): once for each
// handler FreshHandler builds.
inline void SeedWithIds(Handler& h, const std::string& id) {
  static int seeded = 0;
  if (seeded == HandlerGeneration()) return;
  seeded = HandlerGeneration();
  AppendWithIds(h, id, 0);
}

// Handler::Attend of the tenant "" (no tokens configured).
inline absl::Status FuzzAttend(const v1::AttendRequest& request, v1::AttendResponse* response,
                               const std::string& tenant) {
  return FreshHandler().Attend(request, response, tenant);
}

}  // namespace fuzz
}  // namespace driftkv

#endif  // DRIFTKV_FUZZ_FUZZ_HANDLER_H_
