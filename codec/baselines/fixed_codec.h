// `fixed`: the matched-storage control of the D-Quant paper (Appendix B).
// The same preprocessing as D-Quant (dquant_codec.h): Hadamard per head,
// keys minus the INT8 channel mean of their window (the same side record),
// one token-wise min-max grid per stream of n values with M levels; then
// nearest-level rounding (no entropy coding, no drift), a least-squares
// refit of (s, o) to the symbols, fp16 rounding of (s, o), and nearest-level
// rounding again on the stored fp16 grid (which never increases the error
// of the refit grid).
//
// Record (keys and values), stride = 4 + BaseMBytes(n, M):
//   [0:2)  scale  fp16, the grid step s
//   [2:4)  offset fp16, the grid origin o
//   [4:stride) the n symbols, exact base-M integer (base_m.h)
// Storage is therefore the paper's ideal charge of log2 M bits per symbol
// plus fp16 metadata, rounded up to a whole byte once per stream. Keys add
// the mean record of D-Quant (mean_stride bytes per window of W tokens).
// Value j decodes to o + s * m_j (+ mu_j for keys), then the inverse
// Hadamard.
#ifndef DRIFTKV_CODEC_BASELINES_FIXED_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_FIXED_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "codec/kv_codec.h"

namespace driftkv {
namespace baselines {

class FixedCodec : public KvCodec {
 public:
  // head_dim a power of two; levels in [2, 256]; mean_window >= 1.
  static absl::StatusOr<std::unique_ptr<KvCodec>> Create(int kv_heads, int head_dim, int key_levels, int value_levels,
                                                         int mean_window);

  std::string name() const override { return "fixed"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  size_t key_stride() const override { return 4 + key_bytes_; }
  size_t value_stride() const override { return 4 + value_bytes_; }
  int block_tokens() const override { return mean_window_; }
  size_t side_stride() const override;  // D-Quant's mean_stride

  absl::Status EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                           uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                           CodecStats* stats) const override;
  absl::Status DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side, int count,
                           float* keys, float* values, CodecScratch* scratch) const override;

 private:
  FixedCodec(int kv_heads, int head_dim, int key_levels, int value_levels, int mean_window);
  // x[0..n) (preprocessed) -> record; counts moved symbols into stats.
  void EncodeStream(const float* x, int levels, size_t bytes, uint8_t* record, CodecScratch* scratch,
                    StreamStats* stats) const;
  absl::Status DecodeStream(const uint8_t* record, int levels, size_t bytes, float* x, CodecScratch* scratch) const;

  int kv_heads_, head_dim_, key_levels_, value_levels_, mean_window_;
  size_t key_bytes_, value_bytes_;  // base-M payloads
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_FIXED_CODEC_H_
