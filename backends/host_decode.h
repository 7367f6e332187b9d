// The host decode of stored tokens, shared by every backend (the CUDA
// backend decodes on the host too: its host arena mirrors the device one,
// byte for byte): records -> floats in the codec's domain, then, with a
// WUSH transform, back to the model's domain.
#ifndef DRIFTKV_BACKENDS_HOST_DECODE_H_
#define DRIFTKV_BACKENDS_HOST_DECODE_H_

#include "absl/status/status.h"
#include "backends/page_pool.h"
#include "codec/dquant_codec.h"
#include "codec/level_page.h"
#include "codec/transform/transform.h"

namespace driftkv {

// Tokens [first, first + count) of `page` into float [count][kv_heads]
// [head_dim] arrays; `transform` null for the codec's own rotation,
// otherwise T_K^-1 is applied to the keys and, unless values_folded,
// T_V^-1 to the values. DataLoss naming the page and the token on a
// corrupt record.
absl::Status DecodePageTokens(const DQuantCodec& codec, const PagePool& pool, PageId page, int first, int count,
                              const LayerTransform* transform, bool values_folded, float* keys, float* values,
                              CodecScratch* scratch);

// The same for a level page of the hot tier (codec/level_page.h) at host
// address `page` (`id` names it in errors): bit-identical to decoding the
// cold page it was promoted from (DQuantCodec::KeyFromSymbols /
// ValueFromSymbols after the fixed-width levels). DataLoss naming the page
// and the token for a level outside the codec's alphabet (a corrupt page).
absl::Status DecodeLevelPageTokens(const DQuantCodec& codec, const LevelPageLayout& layout, const uint8_t* page,
                                   PageId id, int first, int count, const LayerTransform* transform, bool values_folded,
                                   float* keys, float* values, CodecScratch* scratch);

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_HOST_DECODE_H_
