// GPU decode attention over level pages (the hot tier, codec/level_page.h),
// and the promotion of cold D-Quant pages to level pages on the device.
//
// BATCH. As kernels/attention.h: an item is one (sequence, layer, query
// token) with its pages listed in page_table[page_start[i] ..), every page
// but the last full, an optional bf16 window and out/lse per query head.
// Here every page id names a level page of `layout` at pool_dev + id *
// layout.page_bytes.
//
// DETERMINISM. An item's output depends only on that item: its pages are
// cut into splits of LevelPagesPerSplit(pages) pages (a function of its own
// length, never of the batch), each split is summed in a fixed order, no
// float atomics anywhere, and the merge takes the splits in order. So an
// item gives the same bits alone, in any batch, and beside any other work.
//
// Kernels exist for head_dim in {64, 128} and q_heads / kv_heads in {2, 4}.
#ifndef DRIFTKV_KERNELS_LEVEL_ATTENTION_H_
#define DRIFTKV_KERNELS_LEVEL_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/host_device.h"
#include "codec/level_page.h"

namespace driftkv {
namespace gpu {

struct LevelAttentionParams {
  const uint8_t* pool_dev = nullptr;  // level pages
  LevelPageLayout layout;
  int items = 0;
  int q_heads = 0;
  int max_pages = 0;                          // max over items of pages_i (host value)
  const int32_t* page_table_dev = nullptr;
  const int32_t* page_start_dev = nullptr;    // [items]
  const int32_t* tokens_dev = nullptr;        // [items] tokens in pages
  const uint16_t* window_k_dev = nullptr;     // as DQuantAttentionParams
  const uint16_t* window_v_dev = nullptr;
  const int32_t* window_tokens_dev = nullptr;
  const int32_t* window_start_dev = nullptr;
  const float* query_dev = nullptr;           // [items][q_heads][head_dim]
  float softmax_scale = 0.0f;
  float* out_dev = nullptr;
  float* lse_dev = nullptr;
  void* workspace_dev = nullptr;              // LevelAttentionWorkspaceBytes(...)
  // WUSH-KV, as DQuantAttentionParams (null: the codec's Hadamard).
  const float* transforms_dev = nullptr;
  int transform_layers = 0;
  const int32_t* layer_dev = nullptr;
  bool values_folded = false;
};


// Pages per split of an item with `pages` pages: a function of the item's
// own length only (batch invariance). 8 pages (2 per warp) up to 256 pages,
// then about 32 splits per KV head, at most 32 pages a split.
DRIFTKV_HOST_DEVICE inline int LevelPagesPerSplit(int pages) {
  const int per = (pages + 31) / 32;
  return per < 8 ? 8 : (per > 32 ? 32 : per);
}

size_t LevelAttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages);

absl::Status LaunchLevelAttention(const LevelAttentionParams& p, cudaStream_t stream);

// Runs the kernel's dequantisers on every base-6 byte pair and every key
// field position; returns how many levels came out wrong (tests: 0).
absl::StatusOr<int> LevelDecodeSelfTest();

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_ATTENTION_H_
