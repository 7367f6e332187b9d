// GPU decode attention over level pages (the hot tier, codec/level_page.h),
// and the promotion of cold D-Quant pages to level pages on the device.
//
// BATCH. The AttentionBatch of kernels/attention_batch.h, the same a cold
// launch takes: an item is one (sequence, layer, query token) with its pages
// listed in page_table[page_start[i] ..), every page but the last full, an
// optional bf16 window and out/lse per query head. Here every page id names
// a level page.
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
#include "codec/host_device.h"
#include "codec/level_page.h"
#include "kernels/attention_batch.h"

namespace driftkv {
namespace gpu {

// Where the bf16 window and the merge of the splits run
// (kernels/window_merge.cuh): in the attention kernel's own launch, or in a
// second launch; both give the same bits. kAuto: in the launch when the
// page blocks fit in one wave (a second launch would then add its latency
// to a short kernel: on the H200 1 x 8K took 0.0322 against 0.0360 ms,
// 1 x 128K 0.0878 against 0.0946), else a second launch (window blocks in
// the first would take slots from the pages: 64 x 8K 0.3098 against
// 0.2576, 16 x 32K 0.2743 against 0.2546; docs/hot_tier.md, "The window
// and the merge"). The second launch is a dependent launch, whose window
// work overlaps the first's last wave; since it is, the two places cost
// about the same for one-wave grids on the H100 (docs/bench_gpu.md, "The
// window and merge as a dependent launch"). Without merge_counters_dev
// always a second launch.
enum class LevelMerge { kAuto, kInLaunch, kSecondLaunch };

// The hot kernel: `batch` over level pages of `layout` at pool_dev + id *
// layout.page_bytes (the page ids of the batch's table name level pages).
struct LevelAttentionParams {
  AttentionBatch batch;
  const uint8_t* pool_dev = nullptr;  // the level page pool, device memory
  LevelPageLayout layout;
  // items x kv_heads words, zero before the first launch that uses them and
  // left zero by every launch; used like the workspace, by one launch at a
  // time in stream order. Null: the merge is always a second launch.
  uint32_t* merge_counters_dev = nullptr;
  LevelMerge merge = LevelMerge::kAuto;
  // Recorded on the stream between the split kernel and the merge when set
  // (a timing probe's; null: nothing recorded). With the merge in the
  // launch, after the one kernel.
  cudaEvent_t split_done = nullptr;
};

// Pages per split of an item with `pages` pages: a function of the item's
// own length only (batch invariance). 8 pages (2 per warp) up to 128 pages,
// then about 16 splits per KV head, at most 32 pages a split.
DRIFTKV_HOST_DEVICE inline int LevelPagesPerSplit(int pages) {
  const int per = (pages + 15) / 16;
  return per < 8 ? 8 : (per > 32 ? 32 : per);
}

size_t LevelAttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages);

absl::Status LaunchLevelAttention(const LevelAttentionParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_ATTENTION_H_
