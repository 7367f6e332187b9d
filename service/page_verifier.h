// Checks a cold page's bytes against the CRC-32C its layer recorded when
// the page was encoded (backends/page_checksum.h) and counts the failures
// (Stats checksum_failures; driftkv_page_checksum_failures_total{where}).
// Used by Read, Attend (verify_pages_on_attend), the hot tier's demotion
// and the snapshot. Holds no lock; the counter is atomic.
#ifndef DRIFTKV_SERVICE_PAGE_VERIFIER_H_
#define DRIFTKV_SERVICE_PAGE_VERIFIER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "backends/page_pool.h"
#include "service/metrics.h"
#include "service/sequence.h"

namespace driftkv {

// Where a page checksum was checked (label where= of
// driftkv_page_checksum_failures_total).
enum ChecksumSite : int { kCheckRead = 0, kCheckAttend = 1, kCheckDemote = 2, kCheckSnapshot = 3 };

class PageVerifier {
 public:
  // `pool` (the cold pool) and `metrics` must outlive the verifier.
  PageVerifier(const PagePool& pool, Metrics* metrics) : pool_(pool), metrics_(metrics) {}

  // DATA_LOSS naming the page, layer and sequence (`id` empty: "a hot layer
  // being demoted") when cold page `page` (page `index` of `layer`) does
  // not match layer.page_sums[index]; counts the failure.
  // REQUIRES: layer.mu held.
  absl::Status Verify(const LayerState& layer, size_t index, PageId page, const std::string& id, int layer_index,
                      ChecksumSite site) const;
  // Counts a failure found elsewhere (a snapshot's page on load).
  void CountFailure(ChecksumSite site) const;
  uint64_t failures() const { return failures_.load(); }

 private:
  const PagePool& pool_;
  Metrics* const metrics_;
  mutable std::atomic<uint64_t> failures_{0};
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PAGE_VERIFIER_H_
