// What the merge kernel and the attention kernels that merge in their own
// launch share (nvcc only): writing one head's answer where the item wants
// it, and the exponential both use for the lse weights.
#ifndef DRIFTKV_KERNELS_MERGE_COMMON_CUH_
#define DRIFTKV_KERNELS_MERGE_COMMON_CUH_

#include <cstdint>

#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {

// Head h's answer of item `item`: channel tid's value `o` (tid < head_dim)
// and, from thread 0, the lse, to the item's output target or its rows.
__device__ __forceinline__ void StoreAnswer(const MergeParams& p, int item, int h, int tid, float o, float lse) {
  const int d_count = p.part.head_dim;
  const size_t row = static_cast<size_t>(item) * p.part.q_heads + h;
  const OutputTarget* t = p.targets_dev != nullptr ? p.targets_dev + item : nullptr;
  if (t == nullptr || t->out == nullptr) {
    if (tid < d_count) p.out_dev[row * d_count + tid] = o;
    if (tid == 0) p.lse_dev[row] = lse;
    return;
  }
  const size_t at = static_cast<size_t>(h) * d_count + tid;
  if (tid < d_count) {
    if (t->out_dtype == 1) {
      static_cast<uint16_t*>(t->out)[at] = FloatToBf16Dev(o);
    } else {
      static_cast<float*>(t->out)[at] = o;
    }
  }
  if (tid == 0 && t->lse != nullptr) t->lse[h] = lse;
}

struct FastExp {
  __device__ float operator()(float x) const { return __expf(x); }
};

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_MERGE_COMMON_CUH_
