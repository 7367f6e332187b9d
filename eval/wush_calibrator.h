// WUSH-KV calibration: accumulates, per (layer, KV head), the
// second-order statistics of codec/transform/wush.h from captured queries, keys,
// values and output projections, then builds the transforms file.
// Only d x d sums are kept (4 per head), never the activations: memory is
// O(layers * kv_heads * d^2) whatever the amount of calibration text.
#ifndef DRIFTKV_EVAL_WUSH_CALIBRATOR_H_
#define DRIFTKV_EVAL_WUSH_CALIBRATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"

namespace driftkv {

class WushCalibrator {
 public:
  // q_heads must be a multiple of kv_heads (query head g reads KV head
  // g / (q_heads / kv_heads)); head_dim a power of two.
  static absl::StatusOr<WushCalibrator> Create(int layers, int kv_heads, int q_heads, int head_dim);

  // W > 0: the key Gram matrix is taken over keys minus the mean of their
  // block of W tokens (blocks counted from the first token of each AddLayer
  // call), which is what D-Quant quantizes after its window channel mean;
  // then each call should hold whole sequences of a multiple of W tokens.
  void set_key_center_window(int w) { key_center_window_ = w; }

  // keys, values: [tokens][kv_heads][head_dim]; queries: [query_tokens]
  // [q_heads][head_dim] (null when query_tokens == 0). Adds to `layer`.
  absl::Status AddLayer(int layer, const float* keys, const float* values, int64_t tokens, const float* queries,
                        int64_t query_tokens);

  // o_proj of `layer`, [hidden][q_heads * head_dim] (y = W o). Without it
  // the value Hessian of the layer is the identity.
  absl::Status AddOutputProjection(int layer, const float* wo, int64_t hidden);

  // The transforms of every (layer, head); FailedPrecondition naming layer,
  // head and statistic when one is singular (e.g. no queries were given).
  absl::StatusOr<TransformSet> Build(double gamma = kWushDefaultGamma) const;

 private:
  WushCalibrator(int layers, int kv_heads, int q_heads, int head_dim);
  struct HeadStats {
    OuterSum key_gram, key_hessian, value_gram, value_hessian;
  };
  HeadStats& at(int layer, int head) { return stats_[static_cast<size_t>(layer) * kv_heads_ + head]; }

  int layers_, kv_heads_, q_heads_, head_dim_;
  std::vector<HeadStats> stats_;
  std::vector<bool> has_wo_;
  std::vector<int64_t> key_tokens_;
  int key_center_window_ = 0;
};

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_WUSH_CALIBRATOR_H_
