// Tensors of an Attend batch that live in client memory the device can
// address: a CUDA IPC buffer of a decode worker, or a client's host shared
// memory that the backend page-locked and mapped (cudaHostRegisterMapped).
// The attention kernels read queries from one contiguous float array
// [items][q_heads][head_dim]; the gather moves each item's query there
// from wherever the client put it (src: bf16, fp16 or f32 -> row `row`,
// f32, exactly), checking every element's finiteness on the way (per item,
// the lowest index of a non-finite element). Answers go the other way
// without a launch of their own: the merge writes them to the client's
// buffers (AttentionBatch::out_targets_dev). So answers by reference are
// bit-identical to inline ones.
#ifndef DRIFTKV_KERNELS_REGION_IO_H_
#define DRIFTKV_KERNELS_REGION_IO_H_

#include <cfloat>
#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace driftkv {
namespace gpu {

// Element types of client tensors; the values of proto DType (wire/tensor.h).
enum RegionDType : int { kRegionBf16 = 1, kRegionFp16 = 2, kRegionF32 = 3 };

// One client tensor of an item, device-addressable.
struct RegionIoItem {
  const void* src = nullptr;  // [elements] in src_dtype
  int src_dtype = kRegionF32;
  int row = 0;       // the item's row of the contiguous array
  int elements = 0;  // of src; at most the launch's stride
  // An element of |x| above it is bad, as a non-finite one is (a query's:
  // kQueryLimit of wire/tensor.h).
  float limit = FLT_MAX;
};

struct GatherParams {
  const RegionIoItem* items_dev = nullptr;  // [items], device memory
  int items = 0;
  int stride = 0;            // elements per row of dst_dev
  float* dst_dev = nullptr;  // rows [row][stride] f32; null: check only
  // [items][kGatherBlocks] int32, optional: block b of item i stores at
  // [i][b] the lowest index of a non-finite element, or one of |x| above
  // the item's limit, among those it read
  // (kNoBadElement: none). Every flag is written by a plain store, so
  // nothing resets them before a launch and they may lie in pinned host
  // memory (the device writes them there directly, no copy back); read
  // them with GatherBad after the stream synchronised.
  int32_t* bad_dev = nullptr;
};
constexpr int kGatherBlocks = 4;
constexpr int32_t kNoBadElement = 0x7fffffff;
absl::Status LaunchGather(const GatherParams& p, cudaStream_t stream);
// The lowest non-finite index of item `item` (kNoBadElement: none) in
// flags a gather wrote.
inline int32_t GatherBad(const int32_t* bad, int item) {
  int32_t m = kNoBadElement;
  for (int b = 0; b < kGatherBlocks; ++b) m = bad[item * kGatherBlocks + b] < m ? bad[item * kGatherBlocks + b] : m;
  return m;
}

// Many small host-to-device copies as one: the bytes travel packed in one
// copy, then this launch moves each segment to its place (e.g. a decode
// step's new window token of every item into its cache slot: 128 copies
// of 2 KB per 64-item Attend would each pay a cudaMemcpyAsync's host cost).
struct CopySegment {
  const void* src = nullptr;  // device memory
  void* dst = nullptr;        // device memory
  uint32_t bytes = 0;
};
// Passed by value (a kernel parameter), so no list is uploaded.
constexpr int kMaxCopySegments = 128;
struct CopySegmentsParams {
  int count = 0;
  CopySegment segments[kMaxCopySegments];
};
static_assert(sizeof(CopySegmentsParams) <= 4096, "a kernel parameter");
absl::Status LaunchCopySegments(const CopySegmentsParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_REGION_IO_H_
