// `int`: QuaRot-style INT-b KV quantization. Each head is Hadamard-rotated
// (hadamard.h), then every token's stream of n = kv_heads * head_dim values
// is quantized in groups of `group` consecutive values with an asymmetric
// min-max grid (group_affine.h). Keys and values are coded alike.
// Record (keys and values): the group_affine.h layout, in the rotated domain.
// INT2 / group 128: 2.25 bits per value; INT3: 3.25; INT4: 4.25.
//
// The same class, without rotation, codes KIVI's values, and, with quantile
// clipping, OScaR (oscar_codec.h).
#ifndef DRIFTKV_CODEC_BASELINES_INT_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_INT_CODEC_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "codec/baselines/group_affine.h"
#include "codec/baselines/tokenwise_codec.h"

namespace driftkv {
namespace baselines {

class GroupAffineCodec : public TokenwiseCodec {
 public:
  // head_dim must be a power of two when `rotate`. Specs' n must be
  // kv_heads * head_dim.
  static absl::StatusOr<std::unique_ptr<GroupAffineCodec>> Create(std::string name, int kv_heads, int head_dim,
                                                                  bool rotate, const GroupSpec& keys,
                                                                  const GroupSpec& values);

  size_t key_stride() const override { return GroupRecordBytes(keys_); }
  size_t value_stride() const override { return GroupRecordBytes(values_); }

 protected:
  void EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const override;
  absl::Status DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const override;

 private:
  GroupAffineCodec(std::string name, int kv_heads, int head_dim, bool rotate, const GroupSpec& keys,
                   const GroupSpec& values)
      : TokenwiseCodec(std::move(name), kv_heads, head_dim, /*fp16_metadata=*/true),
        rotate_(rotate),
        keys_(keys),
        values_(values) {}

  bool rotate_;
  GroupSpec keys_;
  GroupSpec values_;
};

// QuaRot-style: rotation, `bits` (1..8) for keys and values, `group` | n.
// rotate = false (CodecOptions.rotation "identity") skips the Hadamard
// rotation, for callers that apply their own transform (WUSH-KV).
absl::StatusOr<std::unique_ptr<KvCodec>> MakeIntCodec(int kv_heads, int head_dim, int bits, int group,
                                                      bool rotate = true);

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_INT_CODEC_H_
