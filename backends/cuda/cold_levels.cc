#include "backends/cuda/cold_levels.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/attention_batch.h"
#include "kernels/level_attention.h"
#include "kernels/level_promote.h"

namespace driftkv {
namespace cuda_backend {
namespace {

// Items [c.first_item, + c.items) of `b` as a batch of their own.
gpu::AttentionBatch ChunkBatch(const gpu::AttentionBatch& b, const ColdChunk& c, int head_dim, int n) {
  const size_t i0 = static_cast<size_t>(c.first_item);
  const size_t rows = static_cast<size_t>(b.q_heads) * head_dim;
  gpu::AttentionBatch s = b;
  s.items = c.items;
  s.max_pages = c.max_pages;
  s.page_start_dev += i0;
  s.tokens_dev += i0;
  if (s.window_tokens_dev != nullptr) s.window_tokens_dev += i0;
  if (s.window_start_dev != nullptr) {
    s.window_start_dev += i0;
  } else if (s.window_k_dev != nullptr) {  // item i's window at token i * kMaxWindow
    s.window_k_dev += i0 * gpu::kMaxWindow * n;
    s.window_v_dev += i0 * gpu::kMaxWindow * n;
  }
  s.query_dev += i0 * rows;
  s.out_dev += i0 * rows;
  s.lse_dev += i0 * b.q_heads;
  if (s.out_targets_dev != nullptr) s.out_targets_dev += i0;
  if (s.layer_dev != nullptr) s.layer_dev += i0;
  return s;
}

}  // namespace

absl::Status ColdLevels::Init(const gpu::PromoteParams& promote, size_t bytes) {
  promote_ = promote;
  const size_t page = promote_.hot.page_bytes;
  capacity_ = page == 0 ? 0 : static_cast<int>(std::min<size_t>(bytes / page, 1 << 24));
  if (capacity_ == 0) return absl::OkStatus();
  absl::Status st = pool_.Reserve(static_cast<size_t>(capacity_) * page);
  if (st.ok()) st = ids_.Reserve(sizeof(int32_t) * 2 * capacity_);
  if (!st.ok()) {
    capacity_ = 0;
    return absl::ResourceExhaustedError(absl::StrCat("device_cold_scratch_bytes ", bytes, ": ", st.message()));
  }
  std::vector<int32_t> ids(2 * static_cast<size_t>(capacity_), gpu::kPageTokens);
  for (int k = 0; k < capacity_; ++k) ids[k] = k;
  return Cuda(cudaMemcpy(ids_.get<void>(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "upload scratch ids");
}

absl::Status ColdLevels::Attend(const gpu::DQuantAttentionParams& fused, absl::Span<const int> item_pages,
                                uint32_t* merge_counters_dev, cudaStream_t stream) {
  const gpu::AttentionBatch& b = fused.batch;
  const int items = b.items, d = fused.layout.head_dim, n = fused.layout.n();
  PlanColdChunks(item_pages, capacity_, &chunks_);
  // Each item's first page within its chunk, for the level kernel's table
  // (the scratch ids 0, 1, ...).
  absl::Status st = host_starts_.Reserve(sizeof(int32_t) * items);
  if (st.ok()) st = starts_.Reserve(sizeof(int32_t) * items);
  if (!st.ok()) return st;
  int32_t* starts = host_starts_.get<int32_t>();
  for (const ColdChunk& c : chunks_) {
    int at = 0;
    for (int i = c.first_item; i < c.first_item + c.items; ++i) {
      starts[i] = at;
      at += item_pages[i];
    }
  }
  st = Cuda(cudaMemcpyAsync(starts_.get<void>(), starts, sizeof(int32_t) * items, cudaMemcpyHostToDevice, stream),
            "upload chunk starts");
  const int32_t* iota = ids_.get<int32_t>();
  for (const ColdChunk& c : chunks_) {
    if (!st.ok()) break;
    gpu::AttentionBatch cb = ChunkBatch(b, c, d, n);
    if (!c.levels) {
      gpu::DQuantAttentionParams p = fused;
      p.batch = cb;
      st = gpu::LaunchDQuantAttention(p, stream);
      continue;
    }
    if (c.pages > 0) {
      gpu::PromoteParams pp = promote_;
      pp.hot_pool_dev = pool_.get<uint8_t>();
      pp.pages = c.pages;
      pp.cold_pages_dev = b.page_table_dev + c.first_page;
      pp.hot_pages_dev = iota;
      pp.tokens_dev = iota + capacity_;  // the launcher's pages are full
      st = gpu::LaunchPromote(pp, stream);
      if (!st.ok()) break;
    }
    gpu::LevelAttentionParams lp;
    lp.batch = cb;
    lp.batch.page_table_dev = iota;
    lp.batch.page_start_dev = starts_.get<int32_t>() + c.first_item;
    lp.pool_dev = pool_.get<uint8_t>();
    lp.layout = promote_.hot;
    lp.merge_counters_dev = merge_counters_dev;
    st = gpu::LaunchLevelAttention(lp, stream);
  }
  // The caller waits for the stream only after a launch that went well;
  // after a failure the starts' upload may still be reading the pinned
  // array that the next call rewrites.
  if (!st.ok()) cudaStreamSynchronize(stream);
  return st;
}

}  // namespace cuda_backend
}  // namespace driftkv
