// The level-form checksums of a hot layer's pages (LayerState::hot_sums),
// parallel to its pages: in hand, or, after a promotion whose backend
// summed the level pages later (Backend::PromotePagesCheckedLater), that
// promotion's PendingChecksums, of which this layer's are [at, at + count),
// followed by the sums of pages appended since. Readers (under the layer's
// lock as readers or writer) take them with View(), which waits for the
// pending ones the first time any layer of the promotion asks; writers hold
// the layer's lock as writers.
#ifndef DRIFTKV_SERVICE_HOT_SUMS_H_
#define DRIFTKV_SERVICE_HOT_SUMS_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backends/page_checksum.h"
#include "backends/pending_checksums.h"

namespace driftkv {

class HotSums {
 public:
  // Sums in hand (a promotion that summed its pages before returning).
  void Set(std::vector<PageChecksum> sums) {
    later_.reset();
    at_ = 0;
    count_ = 0;
    sums_ = std::move(sums);
  }
  // Sums [at, at + count) of a promotion's pending ones.
  void SetLater(std::shared_ptr<PendingChecksums> later, size_t at, size_t count) {
    later_ = std::move(later);
    at_ = at;
    count_ = count;
    sums_.clear();
  }
  void Clear() { Set({}); }
  // Sums of pages appended after the others.
  void Append(absl::Span<const PageChecksum> more) { sums_.insert(sums_.end(), more.begin(), more.end()); }

  // How many pages they cover, without waiting.
  size_t size() const { return count_ + sums_.size(); }

  // All of them in page order (waits for pending ones); `scratch` holds
  // the joined copy when pending sums are followed by appended ones.
  absl::StatusOr<absl::Span<const PageChecksum>> View(std::vector<PageChecksum>* scratch) const {
    if (later_ == nullptr) return absl::MakeConstSpan(sums_);
    absl::StatusOr<absl::Span<const PageChecksum>> all = later_->Wait();
    if (!all.ok()) return all.status();
    if (at_ > all->size() || count_ > all->size() - at_) {
      return absl::InternalError("pending level checksums: fewer than the promotion's pages");
    }
    const absl::Span<const PageChecksum> mine = all->subspan(at_, count_);
    if (sums_.empty()) return mine;
    scratch->assign(mine.begin(), mine.end());
    scratch->insert(scratch->end(), sums_.begin(), sums_.end());
    return absl::MakeConstSpan(*scratch);
  }

 private:
  std::shared_ptr<PendingChecksums> later_;
  size_t at_ = 0, count_ = 0;
  std::vector<PageChecksum> sums_;  // in hand; after the pending ones when there are
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_HOT_SUMS_H_
