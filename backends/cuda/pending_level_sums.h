// A checked promotion's level-page checksums, summed on the backend's
// second stream after the promotion returned (Backend::
// PromotePagesCheckedLater). The words sit in the backend's device buffer
// until they are downloaded: by the first Wait() of a layer that needs
// them, or by the backend before it gives the buffer to the next
// promotion (Settle); after Settle nothing of the backend's is touched.
#ifndef DRIFTKV_BACKENDS_CUDA_PENDING_LEVEL_SUMS_H_
#define DRIFTKV_BACKENDS_CUDA_PENDING_LEVEL_SUMS_H_

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "backends/pending_checksums.h"

namespace driftkv {
namespace cuda_backend {

class PendingLevelSums : public PendingChecksums {
 public:
  // `done` is recorded after the sums' kernel; `sums_dev` holds `count`
  // words once it has passed. Both stay the backend's.
  PendingLevelSums(int device, cudaEvent_t done, const uint32_t* sums_dev, int count)
      : device_(device), done_(done), sums_dev_(sums_dev), count_(count) {}

  // Waits for the sums and downloads them, once; thread-safe.
  void Settle() ABSL_LOCKS_EXCLUDED(mu_);

 protected:
  absl::Status Fetch(std::vector<PageChecksum>* sums) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int device_;
  const cudaEvent_t done_;
  const uint32_t* const sums_dev_;
  const int count_;
  absl::Mutex mu_;
  bool settled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<PageChecksum> sums_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_PENDING_LEVEL_SUMS_H_
