// Level-form checksums that a backend hands back before it has computed
// them (Backend::PromotePagesCheckedLater): on cuda a promotion returns once
// its cold pages are checked and its level pages written, and the level
// pages are summed on a second stream beside the work that follows (the
// Attend that asked for the promotion). One object serves every layer of
// that promotion; the first Wait() blocks until the sums are there and
// every later one returns them at once. Thread-safe.
#ifndef DRIFTKV_BACKENDS_PENDING_CHECKSUMS_H_
#define DRIFTKV_BACKENDS_PENDING_CHECKSUMS_H_

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "backends/page_checksum.h"

namespace driftkv {

class PendingChecksums {
 public:
  virtual ~PendingChecksums() = default;

  // The sums, in the order of the promotion's moves, or the error that
  // kept them from being computed (the same error every call).
  absl::StatusOr<absl::Span<const PageChecksum>> Wait() {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      status_ = Fetch(&sums_);
      done_ = true;
    }
    if (!status_.ok()) return status_;
    return absl::MakeConstSpan(sums_);
  }

 protected:
  // Blocks until the sums are computed and fills *sums; called once.
  virtual absl::Status Fetch(std::vector<PageChecksum>* sums) = 0;

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<PageChecksum> sums_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_PENDING_CHECKSUMS_H_
