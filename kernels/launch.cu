// Host helpers shared by every launcher of kernels/: CUDA errors as
// statuses, the device query, the workspace of split-KV partial states and
// the check of the page layout the kernels read.
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"

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
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

Workspace CarveWorkspace(void* ws, const PartialLayout& part) {
  float* base = static_cast<float*>(ws);
  const size_t c = part.count();
  return Workspace{base, base + c, base + 2 * c};
}

size_t AttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages) {
  const size_t splits = static_cast<size_t>(max_pages > 0 ? max_pages : 1);
  return static_cast<size_t>(items) * (splits * (2 + head_dim) + head_dim) * q_heads * sizeof(float);
}

}  // namespace gpu
}  // namespace driftkv
