// D-Quant (codec/dquant_codec.h) behind the KvCodec interface: one block is
// one key-mean window, the side record its mean record.
#ifndef DRIFTKV_CODEC_DQUANT_KV_CODEC_H_
#define DRIFTKV_CODEC_DQUANT_KV_CODEC_H_

#include <string>
#include <utility>

#include "codec/dquant_codec.h"
#include "codec/kv_codec.h"
#include "wire/half.h"

namespace driftkv {

class DQuantKvCodec : public KvCodec {
 public:
  explicit DQuantKvCodec(DQuantCodec codec) : codec_(std::move(codec)) {}
  const DQuantCodec& codec() const { return codec_; }

  std::string name() const override { return "dquant"; }
  int kv_heads() const override { return codec_.config().kv_heads; }
  int head_dim() const override { return codec_.config().head_dim; }
  size_t key_stride() const override { return codec_.key_stride(); }
  size_t value_stride() const override { return codec_.value_stride(); }
  int block_tokens() const override { return codec_.config().mean_window; }
  size_t side_stride() const override { return codec_.mean_stride(); }
  Settings settings() const override {
    const DQuantConfig& c = codec_.config();
    return Settings{c.key_levels, c.value_levels, c.key_bytes, c.value_bytes, c.alpha, RefitName(c.value_refit)};
  }
  // The record's fp16 scale and offset must hold the values (stream_codec.h).
  double max_abs_value() const override { return kHalfMax; }

  absl::Status EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                           uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                           CodecStats* stats) const override {
    return codec_.EncodeWindow(keys, values, count, key_records, value_records, side, scratch, &stats->keys,
                               &stats->values);
  }
  absl::Status DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side, int count,
                           float* keys, float* values, CodecScratch* scratch) const override;

 private:
  DQuantCodec codec_;
};

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_DQUANT_KV_CODEC_H_
