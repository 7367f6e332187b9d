// Base of the baselines whose records depend on one token only (no side
// record): int, oscar, turbo, fp8, bf16. A subclass codes one token's key or
// value stream ([kv_heads][head_dim] floats) into a fixed-size record; this
// class checks the input and loops over the tokens of a block.
#ifndef DRIFTKV_CODEC_BASELINES_TOKENWISE_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_TOKENWISE_CODEC_H_

#include <string>

#include "codec/kv_codec.h"

namespace driftkv {
namespace baselines {

class TokenwiseCodec : public KvCodec {
 public:
  TokenwiseCodec(std::string name, int kv_heads, int head_dim, bool fp16_metadata)
      : name_(std::move(name)), kv_heads_(kv_heads), head_dim_(head_dim), fp16_metadata_(fp16_metadata) {}

  std::string name() const override { return name_; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int block_tokens() const override { return 1; }
  size_t side_stride() const override { return 0; }

  absl::Status EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                           uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                           CodecStats* stats) const override;
  absl::Status DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side, int count,
                           float* keys, float* values, CodecScratch* scratch) const override;

 protected:
  // One stream of n() values; the input is finite (and within the fp16
  // range when fp16_metadata). Decode returns DataLoss on a corrupt record
  // and still writes n() finite values.
  virtual void EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const = 0;
  virtual absl::Status DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const = 0;

 private:
  std::string name_;
  int kv_heads_;
  int head_dim_;
  bool fp16_metadata_;
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_TOKENWISE_CODEC_H_
