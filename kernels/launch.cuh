// The host side every attention launcher shares (nvcc only): the device's
// multiprocessor count, the split-KV plan, the one dispatch switch over the
// (head_dim, GQA group) instances, the launch with its shared-memory
// attribute, and the merge launch that follows every attention kernel.
#ifndef DRIFTKV_KERNELS_LAUNCH_CUH_
#define DRIFTKV_KERNELS_LAUNCH_CUH_

#include <algorithm>
#include <type_traits>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention_batch.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {

// Multiprocessors of the current device (cudaDeviceGetAttribute, read once
// per device and cached); 1 when the query fails.
int SmCount();

// How a launch splits each item's `units` (pages or chunks of pages) over
// blocks: `splits` blocks per item, each taking `units_per_split`
// consecutive units (the last may take fewer). `requested` > 0 is taken as
// is (at most one split per unit); otherwise enough splits for `waves`
// waves of blocks over the device's multiprocessors, given
// `blocks_per_split` blocks per split index (items x whatever else the grid
// spans), with at least `min_units_per_split` units each.
struct SplitPlan {
  int splits = 1;
  int units_per_split = 1;
};
SplitPlan PlanSplits(int units, int requested, int blocks_per_split, int waves, int min_units_per_split);

// The one dispatch switch of the attention kernels: calls
// launch(std::integral_constant<int, D>, std::integral_constant<int, G>)
// for the instantiated (head_dim, group) pairs, InvalidArgument naming
// `what` otherwise.
template <typename Launch>
absl::Status DispatchHeadDimGroup(int head_dim, int group, const char* what, Launch&& launch) {
  using I128 = std::integral_constant<int, 128>;
  using I64 = std::integral_constant<int, 64>;
  using G4 = std::integral_constant<int, 4>;
  using G2 = std::integral_constant<int, 2>;
  switch (head_dim * 16 + group) {
    case 128 * 16 + 4: return launch(I128(), G4());
    case 128 * 16 + 2: return launch(I128(), G2());
    case 64 * 16 + 4: return launch(I64(), G4());
    case 64 * 16 + 2: return launch(I64(), G2());
    default:
      return absl::InvalidArgumentError(absl::StrCat("no ", what, " kernel for head_dim ", head_dim, " and GQA group ",
                                                     group, " (have 64/128 x 2/4)"));
  }
}

// Raises `kernel`'s dynamic shared memory limit on the current device to
// at least `smem` bytes, calling the driver only the first time a
// (device, kernel) pair needs more than before: a decode step launches
// the same kernels once per layer, and the call is host time in front of
// the device's work.
cudaError_t EnsureDynamicSmem(const void* kernel, size_t smem);

// Sets the kernel's dynamic shared memory limit to `smem` and launches it.
template <typename Args>
absl::Status LaunchKernel(void (*kernel)(Args), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                          const char* what, const Args& args) {
  cudaError_t e = EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("cudaFuncSetAttribute(", what, ")").c_str());
  kernel<<<grid, threads, smem, stream>>>(args);
  e = cudaGetLastError();
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat(what, " launch").c_str());
  return absl::OkStatus();
}

// LaunchKernel for a kernel that depends on the one launched before it on
// `stream` (programmatic dependent launch, sm_90): its blocks may start
// once every block of that kernel has run LaunchDependents() or exited,
// so they fill the SMs that the earlier kernel's last wave leaves idle.
// Before it reads anything the earlier kernel writes, each block must run
// WaitPrerequisites(); what it does before that may read only what was
// complete before the earlier kernel began.
template <typename Args>
absl::Status LaunchDependentKernel(void (*kernel)(Args), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                                   const char* what, const Args& args) {
  cudaError_t e = EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("cudaFuncSetAttribute(", what, ")").c_str());
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  e = cudaLaunchKernelEx(&config, kernel, args);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat(what, " launch").c_str());
  return absl::OkStatus();
}

// The merge of the splits' partial states in `ws` into out_dev / lse_dev
// (the part of MergeParams every launcher fills; a launcher adds the
// rotation, the transform and the window).
inline MergeParams MergeFor(const PartialLayout& part, const Workspace& ws, int kv_heads, const float* query_dev,
                            float softmax_scale, float* out_dev, float* lse_dev) {
  MergeParams m{};
  m.part = part;
  m.m_dev = ws.m;
  m.l_dev = ws.l;
  m.acc_dev = ws.acc;
  m.rotated = false;
  m.kv_heads = kv_heads;
  m.query_dev = query_dev;
  m.softmax_scale = softmax_scale;
  m.out_dev = out_dev;
  m.lse_dev = lse_dev;
  return m;
}

// The split indices a grid needs so that every item of at most `units`
// units gets all of its splits when an item of u units takes
// ceil(u / per_split(u)) of them: per_split may grow with the length (a
// function of the item alone keeps answers batch-invariant), so a shorter
// item can need more splits than the longest.
template <typename PerSplit>
int SplitsCovering(int units, PerSplit per_split) {
  int splits = 1;
  for (int u = 1; u <= units; ++u) splits = std::max(splits, (u + per_split(u) - 1) / per_split(u));
  return splits;
}

// The queries an attention kernel on compressed pages reads. Without
// transforms: b.query_dev itself. With WUSH-KV transforms: H T_K^-T q of
// every item written to `out` ([items][q_heads][head_dim] floats of the
// workspace; kernels/transform.h), so that the kernel's own Hadamard of the
// query yields T_K^-T q and the kernel is the same for both rotations.
absl::StatusOr<const float*> PageQueries(const AttentionBatch& b, int kv_heads, int head_dim, float* out,
                                         cudaStream_t stream);

// The merge after a kernel on compressed pages: the partial states in `ws`
// are in the rotated domain, mapped back by the Hadamard, or by T_V^-1 with
// transforms (unless values_folded); the bf16 window, in the model domain,
// is attended with b.query_dev (the model-domain query). PageMergeParams
// is what it merges; LaunchPageMerge launches it.
MergeParams PageMergeParams(const PartialLayout& part, const Workspace& ws, const AttentionBatch& b, int kv_heads);
absl::Status LaunchPageMerge(const PartialLayout& part, const Workspace& ws, const AttentionBatch& b, int kv_heads,
                             cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LAUNCH_CUH_
