#include "codec/baselines/bf16_codec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/baselines/common.h"
#include "wire/half.h"

namespace driftkv {
namespace baselines {

absl::StatusOr<std::unique_ptr<KvCodec>> Bf16Codec::Create(int kv_heads, int head_dim) {
  if (kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("bf16: shape ", kv_heads, " x ", head_dim, " must be positive"));
  }
  return std::unique_ptr<KvCodec>(new Bf16Codec(kv_heads, head_dim));
}

void Bf16Codec::EncodeStream(bool /*key*/, const float* x, uint8_t* record, CodecScratch* /*scratch*/) const {
  // A finite float near FLT_MAX rounds to bf16 infinity; saturate instead.
  for (int i = 0; i < n(); ++i) {
    uint16_t b = FloatToBf16(x[i]);
    if (std::isinf(Bf16ToFloat(b))) b = static_cast<uint16_t>((b & 0x8000) | 0x7f7f);
    StoreU16(record + 2 * i, b);
  }
}

absl::Status Bf16Codec::DecodeStream(bool /*key*/, const uint8_t* record, float* x, CodecScratch* /*scratch*/) const {
  absl::Status st;
  for (int i = 0; i < n(); ++i) {
    x[i] = Bf16ToFloat(LoadU16(record + 2 * i));
    if (!std::isfinite(x[i])) {
      if (st.ok()) st = absl::DataLossError(absl::StrCat("bf16 record: value ", i, " is ", x[i]));
      x[i] = 0.0f;
    }
  }
  return st;
}

}  // namespace baselines
}  // namespace driftkv
