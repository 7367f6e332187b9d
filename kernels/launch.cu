// Host helpers shared by every launcher of kernels/: CUDA errors as
// statuses, the device query, the workspace of split-KV partial states and
// the check of the page layout the kernels read.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/transform.h"

namespace driftkv {
namespace gpu {

std::string GpuPageLayoutError(const PageLayout& l, PageUse use) {
  if (l.page_tokens != kPageTokens) {
    return absl::StrCat("pages of ", l.page_tokens, " tokens (mean_window); the kernels take ", kPageTokens);
  }
  if (l.value_offset % 16 != 0 || l.mean_offset % 16 != 0 || l.page_bytes % 16 != 0) {
    return absl::StrCat("page offsets not 16-byte aligned: value records at ", l.value_offset, ", mean record at ",
                        l.mean_offset, ", page stride ", l.page_bytes);
  }
  if (l.key_stride % 4 != 0 || l.value_stride % 4 != 0) {
    return absl::StrCat("record strides ", l.key_stride, "/", l.value_stride, " not multiples of 4");
  }
  if (use == PageUse::kAttend && l.mean_stride < kGpuReadAheadBytes) {
    return absl::StrCat("mean record of ", l.mean_stride, " bytes is shorter than the decoders' read-ahead of ",
                        kGpuReadAheadBytes, " bytes past the last value record");
  }
  return "";
}

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

bool GpuAvailable() {
  return GpuCount() > 0;
}

int GpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Workspace CarveWorkspace(void* ws, const PartialLayout& part) {
  float* base = static_cast<float*>(ws);
  const size_t c = part.count();
  return Workspace{base, base + c, base + 2 * c};
}

size_t AttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages) {
  // At most one split a page, and one more for the window's state
  // (kernels/window_merge.cuh).
  const size_t splits = static_cast<size_t>(max_pages > 0 ? max_pages : 1) + 1;
  return static_cast<size_t>(items) * (splits * (2 + head_dim) + head_dim) * q_heads * sizeof(float);
}

cudaError_t EnsureDynamicSmem(const void* kernel, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t>* set = new std::map<std::pair<int, const void*>, size_t>();
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  size_t& limit = (*set)[{device, kernel}];
  if (smem <= limit) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e == cudaSuccess) limit = smem;
  return e;
}

int SmCount() {
  static std::mutex mu;
  static std::vector<int> counts;  // per device, 0: not read yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(counts.size())) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
      cudaGetLastError();
      return 1;
    }
    counts[device] = sms;
  }
  return counts[device];
}

SplitPlan PlanSplits(int units, int requested, int blocks_per_split, int waves, int min_units_per_split) {
  units = std::max(units, 1);
  int splits = requested;
  if (splits <= 0) {
    const int target = (waves * SmCount() + blocks_per_split - 1) / std::max(blocks_per_split, 1);
    splits = std::max(1, std::min((units + min_units_per_split - 1) / min_units_per_split, target));
  }
  splits = std::min(splits, units);
  SplitPlan plan;
  plan.units_per_split = (units + splits - 1) / splits;
  plan.splits = (units + plan.units_per_split - 1) / plan.units_per_split;
  return plan;
}

absl::StatusOr<const float*> PageQueries(const AttentionBatch& b, int kv_heads, int head_dim, float* out,
                                         cudaStream_t stream) {
  if (b.transforms_dev == nullptr) return b.query_dev;
  if (b.layer_dev == nullptr || b.transform_layers < 1) {
    return absl::InvalidArgumentError("transforms_dev needs layer_dev and transform_layers >= 1");
  }
  HeadTransformParams tp;
  tp.mats_dev = b.transforms_dev;
  tp.layers = b.transform_layers;
  tp.kv_heads = kv_heads;
  tp.head_dim = head_dim;
  tp.matrix = kTfQuery;
  tp.in_dev = b.query_dev;
  tp.out_dev = out;
  tp.rows = b.items;
  tp.heads = b.q_heads;
  tp.layer_dev = b.layer_dev;
  absl::Status st = LaunchHeadTransform(tp, stream);
  if (!st.ok()) return st;
  return static_cast<const float*>(out);
}

MergeParams PageMergeParams(const PartialLayout& part, const Workspace& ws, const AttentionBatch& b, int kv_heads) {
  MergeParams m = MergeFor(part, ws, kv_heads, b.query_dev, b.softmax_scale, b.out_dev, b.lse_dev);
  m.rotated = b.transforms_dev == nullptr;
  if (b.transforms_dev != nullptr && !b.values_folded) {
    m.out_transform_dev = b.transforms_dev;
    m.layer_dev = b.layer_dev;
  }
  m.window_k_dev = b.window_k_dev;
  m.window_v_dev = b.window_v_dev;
  m.window_tokens_dev = b.window_tokens_dev;
  m.window_start_dev = b.window_start_dev;
  m.targets_dev = b.out_targets_dev;
  return m;
}

absl::Status LaunchPageMerge(const PartialLayout& part, const Workspace& ws, const AttentionBatch& b, int kv_heads,
                             cudaStream_t stream) {
  return LaunchMerge(PageMergeParams(part, ws, b, kv_heads), stream);
}

}  // namespace gpu
}  // namespace driftkv
