#include "backends/cuda/pending_level_sums.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace cuda_backend {

void PendingLevelSums::Settle() {
  absl::MutexLock lock(&mu_);
  if (settled_) return;
  settled_ = true;
  cudaSetDevice(device_);  // the calling thread's current device
  cudaError_t e = cudaEventSynchronize(done_);
  std::vector<PageChecksum> sums(static_cast<size_t>(count_));
  static_assert(sizeof(PageChecksum) == sizeof(uint32_t), "the kernel's sums are CRC-32C words");
  if (e == cudaSuccess) e = cudaMemcpy(sums.data(), sums_dev_, sizeof(uint32_t) * sums.size(), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    status_ = absl::InternalError(absl::StrCat("level page checksums after promotion: ", cudaGetErrorString(e)));
    return;
  }
  sums_ = std::move(sums);
}

absl::Status PendingLevelSums::Fetch(std::vector<PageChecksum>* sums) {
  Settle();
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  *sums = sums_;
  return absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
