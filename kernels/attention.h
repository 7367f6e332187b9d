// GPU decode attention over paged KV pools: the fused D-Quant kernel (on the
// compressed records, paper eq. 8-9 and Sec. 4.5) and the bf16 baseline.
//
// POOLS. A pool is one cudaMalloc'ed array of fixed-size pages; a page holds
// kPageTokens = 128 consecutive tokens of one (sequence, layer), which is
// also the D-Quant key-mean window, so each page carries exactly one mean
// record. D-Quant pages have THE page layout of codec/page_layout.h (the
// same as the service's page pool; GpuPageLayoutError says what the kernels
// need of it). bf16 pages (the baseline kernel):
//   [0, 128*n*2)  keys   [token][kv_head][head_dim] bf16 bits
//   [128*n*2, 256*n*2) values, same shape
//
// BATCH. An item is one (sequence, layer, query token): a query
// [q_heads][head_dim] float, and the pages of its history listed in a page
// table. item i owns page_table[page_start[i] .. page_start[i] + pages_i),
// pages_i = ceil(tokens[i] / 128); every page but the last is full. D-Quant
// items may also carry a bf16 window (the newest tokens, uncompressed):
// window_tokens[i] <= kMaxWindow tokens at window_k + i * kMaxWindow * n
// (same for window_v), [token][kv_head][head_dim] bf16 bits. Outputs: out
// [items][q_heads][head_dim] float (model domain) and lse [items][q_heads]
// (natural log of the softmax denominator; -inf and out = 0 when an item has
// no tokens, the identity of the merge rule).
//
// Every pointer ending in _dev is device memory. Launchers check their
// parameters, enqueue on `stream` and return InvalidArgument for shapes they
// have no kernel for, Internal for CUDA errors; they never synchronize.
// Kernels exist for head_dim in {64, 128} and q_heads / kv_heads in {2, 4},
// q_heads <= 32 and kv_heads * head_dim <= 1024.
#ifndef DRIFTKV_KERNELS_ATTENTION_H_
#define DRIFTKV_KERNELS_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "codec/page_layout.h"

namespace driftkv {
namespace gpu {

constexpr int kPageTokens = 128;
// The service keeps up to window_tokens + page_tokens - 1 = 255 bf16 tokens
// per (sequence, layer) with the defaults; the merge kernel scores them
// kMergeThreads at a time.
constexpr int kMaxWindow = 256;

// What a kernel does with pages: the encoder writes them, the attention
// kernel reads them with read-ahead.
enum class PageUse { kEncode, kAttend };
// Empty when the kernels take pages of `layout` (codec/page_layout.h) for
// `use`: page_tokens == kPageTokens, 16-byte aligned offsets and page
// stride, 4-byte aligned record strides, and for kAttend a mean record of
// at least kGpuReadAheadBytes (the decoders' read-ahead past the last value
// record lands in it; only n = 64 is too small). Otherwise what is wrong,
// naming the field and its value.
std::string GpuPageLayoutError(const PageLayout& layout, PageUse use);

inline size_t Bf16PageBytes(int kv_heads, int head_dim) {
  return static_cast<size_t>(2) * kPageTokens * kv_heads * head_dim * sizeof(uint16_t);
}

struct DQuantAttentionParams {
  const uint8_t* pool_dev = nullptr;
  PageLayout layout;                      // codec/page_layout.h
  const uint32_t* tables_dev = nullptr;  // 512 words: key, value (PackDecodeTable)
  int items = 0;
  int q_heads = 0;
  int max_pages = 0;                      // max over items of pages_i (host value)
  const int32_t* page_table_dev = nullptr;
  const int32_t* page_start_dev = nullptr;  // [items]
  const int32_t* tokens_dev = nullptr;      // [items] compressed tokens
  const uint16_t* window_k_dev = nullptr;   // may be null when no item has a window
  const uint16_t* window_v_dev = nullptr;
  const int32_t* window_tokens_dev = nullptr;  // [items] or null
  // [items] or null: item i's window starts at token window_start_dev[i] of
  // window_k/v (windows packed back to back); null: at i * kMaxWindow.
  const int32_t* window_start_dev = nullptr;
  const float* query_dev = nullptr;         // [items][q_heads][head_dim]
  float softmax_scale = 0.0f;
  float* out_dev = nullptr;                 // [items][q_heads][head_dim]
  float* lse_dev = nullptr;                 // [items][q_heads]
  void* workspace_dev = nullptr;            // AttentionWorkspaceBytes(...)
  int splits = 0;                           // 0: chosen by the launcher
  // WUSH-KV (kernels/transform.h): null for the codec's Hadamard rotation.
  // Otherwise the pages hold T_K k and T_V v (codec rotation "identity"):
  // the launcher maps each item's query to q' = T_K^-T q for the pages (in
  // the workspace), the merge maps the pages' output back with T_V^-1
  // (skipped when values_folded) and attends the window, which is in the
  // model domain, with the query as given.
  const float* transforms_dev = nullptr;    // device form, [layers][kv_heads][4][D][D]
  int transform_layers = 0;
  const int32_t* layer_dev = nullptr;       // [items], each in [0, transform_layers)
  bool values_folded = false;
};

struct Bf16AttentionParams {
  const uint8_t* pool_dev = nullptr;
  int kv_heads = 0;
  int head_dim = 0;
  int items = 0;
  int q_heads = 0;
  int max_pages = 0;
  const int32_t* page_table_dev = nullptr;
  const int32_t* page_start_dev = nullptr;
  const int32_t* tokens_dev = nullptr;
  const float* query_dev = nullptr;
  float softmax_scale = 0.0f;
  float* out_dev = nullptr;
  float* lse_dev = nullptr;
  void* workspace_dev = nullptr;
  int splits = 0;
};

// Workspace for the split-KV partial states (and the transformed queries of
// a WUSH launch): enough for any launch with at most `items` items, q_heads
// heads, head_dim and max_pages pages.
size_t AttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages);

absl::Status LaunchDQuantAttention(const DQuantAttentionParams& p, cudaStream_t stream);
absl::Status LaunchBf16Attention(const Bf16AttentionParams& p, cudaStream_t stream);

// True when a CUDA device is usable (tests print "skipped: no GPU" otherwise).
bool GpuAvailable();

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_ATTENTION_H_
