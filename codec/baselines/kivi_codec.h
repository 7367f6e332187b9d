// `kivi`: KIVI-style asymmetric quantization without rotation.
// Keys are quantized per channel: a block of `group` consecutive tokens
// shares, for each of the n channels, one min-max grid over the block's
// tokens (the side record). Values are quantized per token in groups of
// `group` consecutive values (group_affine.h, no rotation).
//
// Side record (one per block of `group` tokens), side_stride = 4n bytes:
//   [4j : 4j + 4)  channel j's grid: scale fp16, zero fp16
// Key record: n codes of `bits` bits packed LSB first, ceil(n * bits / 8) bytes.
// Value record: the group_affine.h layout.
// INT2 / group 128: keys 2 + 32 / 128 = 2.25 bits per value (full blocks),
// values 2.25. A block shorter than `group` tokens (the tail of a sequence)
// has its grids over the tokens it holds and costs more per token.
//
// Not reproduced: KIVI's streaming of the not-yet-full key group in full
// precision (here the evaluation's --residual plays that role).
#ifndef DRIFTKV_CODEC_BASELINES_KIVI_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_KIVI_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "codec/baselines/group_affine.h"
#include "codec/kv_codec.h"

namespace driftkv {
namespace baselines {

class KiviCodec : public KvCodec {
 public:
  // bits in [1, 8]; group >= 1 dividing kv_heads * head_dim.
  static absl::StatusOr<std::unique_ptr<KvCodec>> Create(int kv_heads, int head_dim, int bits, int group);

  std::string name() const override { return "kivi"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  size_t key_stride() const override;
  size_t value_stride() const override { return GroupRecordBytes(values_); }
  int block_tokens() const override { return values_.group; }
  size_t side_stride() const override { return 4 * static_cast<size_t>(n()); }

  absl::Status EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                           uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                           CodecStats* stats) const override;
  absl::Status DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side, int count,
                           float* keys, float* values, CodecScratch* scratch) const override;

 private:
  KiviCodec(int kv_heads, int head_dim, const GroupSpec& values)
      : kv_heads_(kv_heads), head_dim_(head_dim), values_(values) {}

  int kv_heads_;
  int head_dim_;
  GroupSpec values_;  // values_.group is also the key block length
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_KIVI_CODEC_H_
