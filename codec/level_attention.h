// Decode attention of one query token over level pages (the hot tier,
// codec/level_page.h) on the CPU, with CompressedAttention's contract
// (codec/attention.h): GQA, an optional bf16 window, out and lse, online
// softmax over blocks, one page being one block.
//
// EXACTNESS. Levels are unpacked from their fixed-width fields (no rANS) and
// then go through the same AttentionCore as CompressedAttention's decoded
// symbols: the same float operations in the same order. For the same tokens
// (pages promoted from the cold records, codec/level_page.h PromotePage) out
// and lse are bit-identical to CompressedAttention on those records.
#ifndef DRIFTKV_CODEC_LEVEL_ATTENTION_H_
#define DRIFTKV_CODEC_LEVEL_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"

namespace driftkv {

// One level page (LevelPageLayout::page_bytes bytes, host memory) and the
// tokens it holds (1..128, the first `tokens` of the page).
struct LevelPageRef {
  const uint8_t* page = nullptr;
  int tokens = 0;
};

// Reused across calls; one per thread.
struct LevelAttentionScratch {
  AttentionScratch attention;
  std::vector<uint8_t> key_levels, value_levels;                        // [128][n]
  std::vector<uint32_t> key_headers, value_headers;                     // [128]
  std::vector<uint8_t> mean_record;                                     // 4 + n
  std::vector<float> key_scale, key_offset, value_scale, value_offset;  // [128]
};

// Same parameters and results as CompressedAttention, with level pages of
// MakeLevelPageLayout(codec) in place of cold blocks. InvalidArgument if the
// codec has no level page, a page's tokens are outside [1, 128] or q_heads
// is not a multiple of kv_heads; DataLoss if a header's grid is not finite
// or negative (as a cold record's would be). Levels are not range-checked:
// a corrupt level field gives a wrong, finite result, never a bad access.
absl::Status LevelAttention(const DQuantCodec& codec, absl::Span<const LevelPageRef> pages, const Bf16Tokens& window,
                            const float* query, int q_heads, float softmax_scale, float* out, float* lse,
                            LevelAttentionScratch* scratch);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_LEVEL_ATTENTION_H_
