// The service's storage rule (service/handler.h) replayed with the codec
// alone, as the yardstick the service must match: after `tokens` tokens of
// one layer were appended, pages j = 0 .. pages - 1 hold tokens [jP, (j+1)P)
// encoded from their bf16 values, pages = (tokens - R) / P once tokens >=
// R + P (else 0), and the rest is the bf16 window. Used by the tests and by
// `driftkv fixture --local_check`.
#ifndef DRIFTKV_EVAL_SERVICE_REPLAY_H_
#define DRIFTKV_EVAL_SERVICE_REPLAY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"

namespace driftkv {

// Pages the service holds for a layer of `tokens` tokens with window R and
// pages of P tokens.
inline int64_t StoredPages(int64_t tokens, int window_tokens, int page_tokens) {
  return tokens >= window_tokens + page_tokens ? (tokens - window_tokens) / page_tokens : 0;
}

class ServiceReplay {
 public:
  // Encodes every full page of the first `tokens` tokens (float [tokens][n],
  // rounded to bf16 first, as the service stores them). `codec`, `keys` and
  // `values` must outlive the replay.
  static absl::StatusOr<ServiceReplay> Encode(const DQuantCodec& codec, int window_tokens, const float* keys,
                                              const float* values, int64_t tokens);

  // Attention as the service computes it after the first `tokens` (<= the
  // encoded count) were appended: out [q_heads][head_dim], lse [q_heads].
  absl::Status Attend(int64_t tokens, const float* query, int q_heads, float softmax_scale, float* out, float* lse,
                      AttentionScratch* scratch) const;

 private:
  ServiceReplay(const DQuantCodec& codec, int window_tokens, const float* keys, const float* values)
      : codec_(&codec), window_tokens_(window_tokens), keys_(keys), values_(values) {}

  const DQuantCodec* codec_;
  int window_tokens_;
  const float* keys_;
  const float* values_;
  std::vector<uint8_t> key_records_, value_records_, mean_records_;
};

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_SERVICE_REPLAY_H_
