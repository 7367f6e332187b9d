// The hot tier's page: the same symbols as a D-Quant page (codec/
// dquant_codec.h), stored fixed-width instead of entropy-coded, in an order
// a tensor-core attention kernel reads straight into its fragments.
//
// A page holds kLevelPageTokens = 128 consecutive tokens of one (sequence,
// layer): the key-mean window of a cold page. Byte layout (n = kv_heads *
// head_dim, all offsets 16-byte aligned where a block starts):
//
//   [0, 512)            key headers:   token t at 4t, the first 4 bytes of
//                       its cold key record (fp16 scale, fp16 offset)
//   [512, 1024)         value headers: the same for the value records
//   [1024, 1036)        zero
//   [1036, 1040 + n)    the window's key-mean record (codec/dquant_codec.h),
//                       its 4 + n meaningful bytes: the fp32 scale at 1036,
//                       int8 mean of channel j at 1040 + j (16-byte aligned
//                       per head because head_dim is a multiple of 16)
//   blocks_offset = 1040 + n, then per KV head h:
//     key block   [blocks_offset + h * head_bytes, + key_block_bytes)
//     value block [.. + key_block_bytes, + value_block_bytes)
//   zero padding to page_bytes, the smallest multiple of 64 that holds the
//   blocks (96,320 bytes at 8 x 128)
// Tokens a partial page does not hold have zero headers and level 0.
//
// FRAGMENT ORDER. Both blocks are laid out as [j][lane][16 bytes]: uint4 j
// of lane l at (j * 32 + l) * 16, so a warp reading its j-th uint4 reads
// 512 contiguous bytes. Lane l = 4 g + t (g = l / 4, t = l % 4) receives
// what an mma.m16n8k16 A fragment of lane l needs:
//   a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]
//   a2 = A[g][2t+8, 2t+9] a3 = A[g+8][2t+8, 2t+9]
// A "pair" is one such register: two values, the lower-index column in the
// low half.
//
// Keys (3 bits a level, levels < 8). A = keys [16 tokens][16 channels] of
// m-tile mt (tokens 16 mt ..) and k-step ks (channels 16 ks .. of the head).
// Lane l's pairs of m-tile mt, in order q = ks * 4 + r (r = register, 0..3),
// are grouped 16 at a time into 3 words W0 W1 W2 (D / 64 groups per m-tile):
//   pair e < 15: word e / 5, lower value at bits [3 (e % 5), +3),
//                upper value at bits [16 + 3 (e % 5), +3);
//   pair 15:     bit b of the lower value at bit 15 of W_b, bit b of the
//                upper value at bit 31 of W_b (b = 0, 1, 2).
// The lane's words run m-tile by m-tile, group by group: word w = (mt * D/64
// + group) * 3 + k, in uint4 w / 4, component w % 4. key_block_bytes =
// 48 * head_dim: exactly 3 bits a level.
//
// Values (base 6, levels < 6). A = values transposed, [16 channels][16
// tokens] of m-tile mt (channels 16 mt .. of the head) and k-step ks
// (tokens 16 ks ..): pairs are two consecutive tokens of one channel. Lane
// l's pairs in order p = (ks * MT + mt) * 4 + r (MT = head_dim / 16) are cut
// into three k-step groups: ks 0-2, 3-5, 6-7. In a group, pair i (counted
// from the group's first) belongs to triple i / 3 at digit i % 3; triple j is
// two bytes, E_j = sum_d lower_d 6^d and O_j = sum_d upper_d 6^d (missing
// pairs of the last triple count as 0). Word w of a group holds bytes
// E_2w, E_2w+1, O_2w, O_2w+1 (byte 0 first), so (W & 0x00ff00ff) is
// triple 2w and ((W >> 8) & 0x00ff00ff) triple 2w+1, each as the two packed
// 16-bit lanes a SIMD base-6 decode works on; when a group has an odd number
// of triples (head_dim 64, group 2: 11) the last word's second triple is 0.
// A group's words are padded with zero words to a multiple of 4; the groups
// follow each other. value_block_bytes = 512 x the group uint4s: 5632 at
// head_dim 128 (16 + 16 + 12 words a lane), 3072 at 64 (8 + 8 + 8).
//
// Conversions with the cold page are exact both ways: the symbols of a cold
// record are the levels here (PromotePage), and rANS-coding the levels again
// gives the cold record byte for byte (DemotePage), because rANS coding is
// deterministic and the stream already fitted its payload when it was first
// encoded. "Byte for byte" holds for records as the encoders write them (the
// payload's unused tail and the stride padding zero); a record with other
// bytes there decodes the same and demotes to that canonical record.
#ifndef DRIFTKV_CODEC_LEVEL_PAGE_H_
#define DRIFTKV_CODEC_LEVEL_PAGE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/host_device.h"  // the layout arithmetic below is shared with the CUDA kernels

namespace driftkv {

class DQuantCodec;    // codec/dquant_codec.h (not included: the CUDA kernels read this header)
struct CodecScratch;  // codec/kv_codec.h
struct StreamStats;   // codec/stream_codec.h

constexpr int kLevelPageTokens = 128;
constexpr int kLevelHeadersBytes = 1024;  // key then value headers
constexpr int kLevelMeanOffset = 1036;    // mean record: scale at 1036, int8 at 1040
constexpr int kLevelMeanLevelsOffset = 1040;
constexpr int kLevelKeyMaxLevels = 8;
constexpr int kLevelValueMaxLevels = 6;

// Byte layout of a level page for one shape (see the header comment).
struct LevelPageLayout {
  int kv_heads = 0;
  int head_dim = 0;
  size_t blocks_offset = 0;
  size_t key_block_bytes = 0;    // per KV head
  size_t value_block_bytes = 0;  // per KV head
  size_t page_bytes = 0;

  DRIFTKV_HOST_DEVICE int n() const { return kv_heads * head_dim; }
  DRIFTKV_HOST_DEVICE size_t head_bytes() const { return key_block_bytes + value_block_bytes; }
  DRIFTKV_HOST_DEVICE size_t key_block(int h) const { return blocks_offset + h * head_bytes(); }
  DRIFTKV_HOST_DEVICE size_t value_block(int h) const { return key_block(h) + key_block_bytes; }
};

// Base-6 digits of two value bytes at once: x = b | (b2 << 16).
// digit[d] = (b / 6^d) % 6 | ((b2 / 6^d) % 6) << 16 for b, b2 < 216. The
// divisions are multiply-shift: floor(b * 57 / 2^11) = floor(b / 36) for
// b < 216 and floor(r * 43 / 2^8) = floor(r / 6) for r < 36
// (tests/level_page_test.cc checks every pair); the products stay below
// 2^16, so the halves never mix. A corrupt byte (>= 216) gets digits up to 7,
// the same on the host and on the device, so both see it out of range.
DRIFTKV_HOST_DEVICE inline void LevelBase6Digits(uint32_t x, uint32_t digit[3]) {
  const uint32_t l2 = ((x * 57u) >> 11) & 0x00070007u;
  const uint32_t r = x - 36u * l2;
  const uint32_t l1 = ((r * 43u) >> 8) & 0x00070007u;
  digit[0] = r - 6u * l1;
  digit[1] = l1;
  digit[2] = l2;
}

// Words (32-bit) of lane data in value k-step group `group` (0, 1, 2), padded
// to a multiple of 4; and the first uint4 of the group in the lane's order.
DRIFTKV_HOST_DEVICE constexpr int LevelValueGroupKsteps(int group) {
  return group < 2 ? 3 : 2;
}
DRIFTKV_HOST_DEVICE constexpr int LevelValueGroupWords(int head_dim, int group) {
  const int pairs = LevelValueGroupKsteps(group) * (head_dim / 16) * 4;
  const int triples = (pairs + 2) / 3;
  const int words = (triples + 1) / 2;
  return (words + 3) / 4 * 4;
}
DRIFTKV_HOST_DEVICE inline int LevelValueGroupFirstVec(int head_dim, int group) {
  int v = 0;
  for (int g = 0; g < group; ++g) v += LevelValueGroupWords(head_dim, g) / 4;
  return v;
}

// The layout for a shape: head_dim in {64, 128}, n = kv_heads * head_dim.
// InvalidArgument for other head_dim.
absl::StatusOr<LevelPageLayout> MakeLevelPageLayout(int kv_heads, int head_dim);

// The codec's shape, and InvalidArgument naming the field when the codec
// has no level page: key_levels > 8, value_levels > 6, or mean_window != 128.
absl::StatusOr<LevelPageLayout> MakeLevelPageLayout(const DQuantCodec& codec);

// Levels of `tokens` (<= 128) tokens, [token][n] one byte each in channel
// order (j = head * head_dim + dim; keys < 8, values < 6), plus the tokens'
// 4-byte headers (a record's first 4 bytes read as a little-endian uint32:
// scale bits in [15:0], offset bits in [31:16]) and the mean record, into a
// level page (every byte of page[0, page_bytes) written). `layout` comes from
// MakeLevelPageLayout.
void PackLevelPage(const LevelPageLayout& layout, int tokens, const uint8_t* key_levels, const uint8_t* value_levels,
                   const uint32_t* key_headers, const uint32_t* value_headers, const uint8_t* mean_record,
                   uint8_t* page);

// The inverse: levels [128][n] (level 0 for absent tokens), headers [128],
// and the mean record's 4 + n bytes.
void UnpackLevelPage(const LevelPageLayout& layout, const uint8_t* page, uint8_t* key_levels, uint8_t* value_levels,
                     uint32_t* key_headers, uint32_t* value_headers, uint8_t* mean_record);

// A token's 4-byte header as StreamCodec::DecodeSymbols reads it from a
// record: fp16 scale in [15:0], fp16 offset in [31:16]. False for a header
// no encoder writes (a non-finite scale or offset, or a negative scale): a
// corrupt page, which every reader of level pages refuses.
bool LevelHeaderGrid(uint32_t header, float* scale, float* offset);

// Cold records (a CompressedBlock's arrays: `tokens` key records at
// key_stride, value records at value_stride, one mean record) to a level
// page. DataLoss naming the token if a record does not decode (the page is
// then left untouched); InvalidArgument if tokens is outside [1, 128] or the
// layout is not MakeLevelPageLayout(codec).
absl::Status PromotePage(const DQuantCodec& codec, const LevelPageLayout& layout, const uint8_t* key_records,
                         const uint8_t* value_records, const uint8_t* mean_record, int tokens, uint8_t* page);

// Encodes one mean window of `tokens` tokens (DQuantCodec::EncodeWindow:
// the same arguments, records and statistics) and writes the level page of
// its symbols, byte for byte what PromotePage makes of those records,
// without decoding them: a hot layer's new page. The records are still
// written, since their checksum is what a demotion must give back.
// InvalidArgument as EncodeWindow, or as PromotePage for the shape.
absl::Status EncodeLevelPage(const DQuantCodec& codec, const LevelPageLayout& layout, const float* keys,
                             const float* values, int tokens, uint8_t* key_records, uint8_t* value_records,
                             uint8_t* mean_record, uint8_t* page, CodecScratch* scratch, StreamStats* key_stats,
                             StreamStats* value_stats, StreamStats* key_each = nullptr,
                             StreamStats* value_each = nullptr);

// A level page back to cold records (tokens * stride bytes each, and the
// codec's mean_stride bytes of mean record, padding zeroed): rANS codes the
// known levels without drift. DataLoss if a level is out of the codec's range
// (a corrupt field, e.g. a value byte >= 216) or a stream does not fit its
// payload (a page not made from fitting records); the outputs are then
// unspecified; DataLoss too for a header LevelHeaderGrid refuses (cold
// records that would not decode). InvalidArgument as PromotePage.
absl::Status DemotePage(const DQuantCodec& codec, const LevelPageLayout& layout, const uint8_t* page, int tokens,
                        uint8_t* key_records, uint8_t* value_records, uint8_t* mean_record);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_LEVEL_PAGE_H_
