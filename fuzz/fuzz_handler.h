// The Handler the data-plane fuzz targets answer with: CPU backend, 2
// layers of 1 KV head x 64, a 64 KiB pool, and sequence "s" holding
// kFuzzTokens tokens on both layers, so that an Attend of "s" with q_heads
// 1 or 2 succeeds and reaches the kernels. Rebuilt every 4096 uses so that
// what the inputs append stays small.
#ifndef DRIFTKV_FUZZ_FUZZ_HANDLER_H_
#define DRIFTKV_FUZZ_FUZZ_HANDLER_H_

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

inline Handler& FreshHandler() {
  static std::unique_ptr<Metrics> metrics;
  static std::unique_ptr<Handler> handler;
  static int uses = 0;
  if (handler == nullptr || ++uses % 4096 == 0) {
    handler.reset();
    metrics = std::make_unique<Metrics>();
    const ServiceOptions o = FuzzOptions();
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, metrics.get());
    if (!h.ok()) std::abort();
    handler = *std::move(h);
    for (uint32_t layer = 0; layer < 2; ++layer) {
      v1::AppendChunk c;
      c.set_sequence_id("s");
      c.set_layer(layer);
      c.set_token_count(kFuzzTokens);
      c.set_dtype(v1::DTYPE_BF16);
      c.set_keys(std::string(kFuzzTokens * 64 * 2, '\x3c'));
      c.set_values(std::string(kFuzzTokens * 64 * 2, '\x3b'));
      v1::AppendResponse r;
      if (!handler->Append(c, &r).ok()) std::abort();
    }
  }
  return *handler;
}

// Handler::Attend of the tenant "" (no tokens configured).
inline absl::Status FuzzAttend(const v1::AttendRequest& request, v1::AttendResponse* response,
                               const std::string& tenant) {
  return FreshHandler().Attend(request, response, tenant);
}

}  // namespace fuzz
}  // namespace driftkv

#endif  // DRIFTKV_FUZZ_FUZZ_HANDLER_H_
