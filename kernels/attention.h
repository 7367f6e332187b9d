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
// BATCH. The items, their page tables, windows, queries and results are one
// AttentionBatch (kernels/attention_batch.h), shared with the level-page
// kernel. The bf16 baseline takes the same items in Bf16AttentionParams,
// without window or transforms.
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
#include "absl/status/statusor.h"
#include "codec/page_layout.h"
#include "kernels/attention_batch.h"

namespace driftkv {
namespace gpu {

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

// The cold kernel: `batch` over D-Quant pages of `layout` at pool_dev +
// id * layout.page_bytes.
struct DQuantAttentionParams {
  AttentionBatch batch;
  const uint8_t* pool_dev = nullptr;     // the page pool, device memory
  PageLayout layout;                     // codec/page_layout.h
  const uint32_t* tables_dev = nullptr;  // 512 words: key, value (PackDecodeTable)
  int splits = 0;                        // 0: chosen by the launcher (per item)
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

// Runs the split-KV merge both ways, one block per query head and one per
// KV head's group, on random partial states and bf16 windows of 0 ..
// kMaxWindow - 1 tokens (rotated or not); returns how many output and lse
// floats differ in their bits (tests: 0). With targets (OutputTarget, in
// device or pinned host memory), the group's blocks and then the
// per-head blocks again write two items in three to targets (f32 with the
// lse; bf16 without), which must hold the per-head rows' bits (bf16:
// rounded as wire/half.h FloatToBf16), leaving those items' rows and an
// absent lse untouched.
enum MergeTargets { kMergeTargetsNone, kMergeTargetsDevice, kMergeTargetsHost };
absl::StatusOr<int64_t> MergeKernelsDiffer(int items, int q_heads, int kv_heads, int head_dim, int splits, bool rotated,
                                           MergeTargets targets = kMergeTargetsNone);

// True when a CUDA device is usable (tests print "skipped: no GPU" otherwise).
bool GpuAvailable();
// How many CUDA devices are usable (0 without a driver or device).
int GpuCount();

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_ATTENTION_H_
