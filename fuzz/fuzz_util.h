// Shared by the fuzz targets: the small D-Quant codec they decode with
// (1 KV head x 64, pages of 128 tokens, as the hot tier needs), built once.
#ifndef DRIFTKV_FUZZ_FUZZ_UTIL_H_
#define DRIFTKV_FUZZ_FUZZ_UTIL_H_

#include <cstdlib>

#include "codec/dquant_codec.h"

namespace driftkv {
namespace fuzz {

inline const DQuantCodec& SmallCodec() {
  static const DQuantCodec* codec = [] {
    DQuantConfig c;
    c.kv_heads = 1;
    c.head_dim = 64;
    c.mean_window = 128;
    absl::StatusOr<DQuantCodec> made = DQuantCodec::Create(c);
    if (!made.ok()) std::abort();
    return new DQuantCodec(*std::move(made));
  }();
  return *codec;
}

}  // namespace fuzz
}  // namespace driftkv

#endif  // DRIFTKV_FUZZ_FUZZ_UTIL_H_
