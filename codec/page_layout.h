// THE page layout of D-Quant records: the one definition used by the
// service's page pool (backends/page_pool.h, host arena), the CUDA backend
// (device arena, same page ids), the GPU kernels (kernels/attention.h,
// kernels/encode.h), the GPU tests and bench_gpu. Self-contained (no other
// header of the project) so that nvcc compiles it with the kernels.
//
// A page holds one key-mean window of P = page_tokens consecutive tokens of
// one (sequence, layer), so each page carries exactly one mean record.
// Byte offsets inside a page (computed, never looked up):
//
//   [0, P*Ks)                      key records,   token t at t * Ks
//   [value_offset, +P*Vs)          value records, token t at value_offset + t * Vs
//                                  (value_offset = P*Ks)
//   [mean_offset, +Ms)             the window's key-mean record
//                                  (mean_offset = value_offset + P*Vs)
//   [mean_offset + Ms, page_bytes) zero padding to a multiple of kPageAlign
//
// Ks, Vs, Ms are the codec's key, value and mean record strides
// (codec/dquant_codec.h), each a multiple of 4 bytes. Page p of an arena
// starts at p * page_bytes. The records are those of codec/stream_codec.h
// and codec/dquant_codec.h, unchanged; a full page is one CompressedBlock
// of codec/compressed_attention.h.
//
// What the GPU kernels need, and why this layout gives it
// (GpuPageLayoutError in kernels/attention.h checks it at every launch):
//   - P = 128 (kernels' kPageTokens);
//   - value_offset, mean_offset and page_bytes multiples of 16 (16-byte
//     loads): P*Ks and P*Vs are multiples of 16 whenever P is a multiple of
//     4, and page_bytes is a multiple of 64;
//   - read-ahead: the fused decoder loads a record in 16-byte blocks and
//     may read up to kGpuReadAheadBytes past its end. After a key record
//     come more key records or the value records; after the last value
//     record comes the mean record, which must therefore be at least
//     kGpuReadAheadBytes long (it is 4 + kv_heads * head_dim bytes rounded
//     up to 4, so 132 or more for every shape the kernels take). Nothing
//     reads past the mean record, so a page needs no slack at its end.
#ifndef DRIFTKV_CODEC_PAGE_LAYOUT_H_
#define DRIFTKV_CODEC_PAGE_LAYOUT_H_

#include <cstddef>

namespace driftkv {

// Pages start on cache lines (and on the 16-byte boundaries that GPU loads
// and copy engines want).
constexpr size_t kPageAlign = 64;
// How far past the end of a record the GPU decoder may read: the 16-byte
// block ring of kernels/dquant_attention.cu reads at most 4 blocks ahead of
// the current byte plus the partial block at each end (< 100 bytes), so
// 128 is a safe bound.
constexpr int kGpuReadAheadBytes = 128;

struct PageLayout {
  int page_tokens = 0;  // P
  int kv_heads = 0;
  int head_dim = 0;
  int key_stride = 0;    // Ks, bytes per key record
  int value_stride = 0;  // Vs, bytes per value record
  int mean_stride = 0;   // Ms, bytes of the mean record
  size_t value_offset = 0;
  size_t mean_offset = 0;
  size_t page_bytes = 0;  // the stride of pages in an arena

  int n() const { return kv_heads * head_dim; }
  size_t key_record(int t) const { return static_cast<size_t>(t) * key_stride; }
  size_t value_record(int t) const { return value_offset + static_cast<size_t>(t) * value_stride; }
};

// The layout of pages of `page_tokens` tokens with the given record strides.
inline PageLayout MakePageLayout(int page_tokens, int kv_heads, int head_dim, int key_stride, int value_stride,
                                 int mean_stride) {
  PageLayout l;
  l.page_tokens = page_tokens;
  l.kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.key_stride = key_stride;
  l.value_stride = value_stride;
  l.mean_stride = mean_stride;
  l.value_offset = static_cast<size_t>(page_tokens) * key_stride;
  l.mean_offset = l.value_offset + static_cast<size_t>(page_tokens) * value_stride;
  const size_t end = l.mean_offset + static_cast<size_t>(mean_stride);
  l.page_bytes = (end + kPageAlign - 1) / kPageAlign * kPageAlign;
  return l;
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_PAGE_LAYOUT_H_
