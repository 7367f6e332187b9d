// Checks what a layer stores against the CRC-32Cs recorded when it was
// stored (backends/page_checksum.h) and counts the failures (Stats
// checksum_failures; driftkv_page_checksum_failures_total{where}):
//   - a cold page against LayerState::page_sums (its cold form);
//   - a hot page against LayerState::hot_sums (its level form, recorded at
//     promotion after the cold page was checked);
//   - the bf16 window, token by token, against LayerState::window_sums.
// Used by Read, Attend (verify_pages_on_attend), the hot tier's promotion
// and demotion, the encoding of window tokens into pages and the snapshot.
//
// WHICH COPY. A check reads the copy its path serves or moves: Attend,
// promotion and demotion read the pages through Backend::ChecksumPages
// (the device arena on cuda: the bytes the kernels read); Read of a cold
// page and the snapshot read the host pool (what DecodeTokens decodes and
// what the file gets; on cpu both are one copy). Hot pages are read
// through the backend always (cuda decodes them from the device).
//
// Holds no lock; the counters are atomic. Every failure is DATA_LOSS naming
// the page (its index and tokens) or the window tokens, the layer and the
// sequence.
#ifndef DRIFTKV_SERVICE_PAGE_VERIFIER_H_
#define DRIFTKV_SERVICE_PAGE_VERIFIER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/page_checksum.h"
#include "backends/page_pool.h"
#include "service/metrics.h"
#include "service/sequence.h"

namespace driftkv {

// Where a checksum was checked (label where= of
// driftkv_page_checksum_failures_total; names in metrics.cc). Window
// failures count as kCheckWindow wherever they are found (Read, Attend,
// encoding, snapshot): the message says where.
enum ChecksumSite : int {
  kCheckRead = 0,      // a page Read decodes
  kCheckAttend = 1,    // a page Attend attends (verify_pages_on_attend)
  kCheckDemote = 2,    // a hot page before, and its cold form after, demotion
  kCheckSnapshot = 3,  // a page the drain writes, or the start reads
  kCheckPromote = 4,   // a cold page before promotion
  kCheckWindow = 5,    // a bf16 window token
};
constexpr int kChecksumSites = 6;
static_assert(sizeof(std::declval<Metrics&>().checksum_failures) == kChecksumSites * sizeof(prometheus::Counter*),
              "one counter per ChecksumSite");

// How a message names a layer: "layer 1 of sequence_id \"x\"".
struct LayerName {
  absl::string_view sequence_id;  // the client's id, or the table key
  int layer = 0;
};

// CRC-32C of one bf16 window token: its n keys then its n values (the
// bytes of window_keys and window_values at the token).
inline PageChecksum WindowTokenSum(const uint16_t* key, const uint16_t* value, size_t n) {
  return Crc32c(reinterpret_cast<const uint8_t*>(value), 2 * n, Crc32c(reinterpret_cast<const uint8_t*>(key), 2 * n));
}

class PageVerifier {
 public:
  enum class Copy { kBackend, kHost };  // see WHICH COPY

  // `cold`, `hot` (null without a hot tier), `backend` and `metrics` must
  // outlive the verifier. `n`: bf16 values per window token and side.
  PageVerifier(const PagePool& cold, const PagePool* hot, Backend& backend, Metrics* metrics, size_t n)
      : cold_(cold), hot_(hot), backend_(backend), metrics_(metrics), n_(n) {}

  // Cold pages `pages` (page indices first, first + 1, ... of the layer)
  // against `expected`, one per page.
  absl::Status VerifyColdPages(absl::Span<const PageId> pages, absl::Span<const PageChecksum> expected, size_t first,
                               Copy copy, const LayerName& name, ChecksumSite site) const;
  // Cold pages' checksums computed elsewhere (a promotion's own, read by
  // the move) against `expected`: VerifyColdPages's verdict.
  absl::Status CheckColdSums(absl::Span<const PageChecksum> computed, absl::Span<const PageChecksum> expected,
                             size_t first, const LayerName& name, ChecksumSite site) const;
  // Hot pages' checksums computed elsewhere (HotSums of several layers at
  // once) against `expected`: VerifyHotPages's verdict.
  absl::Status CheckHotSums(absl::Span<const PageChecksum> computed, absl::Span<const PageChecksum> expected,
                            size_t first, const LayerName& name, ChecksumSite site) const;
  // Hot pages against the checksums of their level form (always through
  // the backend).
  absl::Status VerifyHotPages(absl::Span<const PageId> pages, absl::Span<const PageChecksum> expected, size_t first,
                              const LayerName& name, ChecksumSite site) const;
  // Every page of the layer in its tier (cold: `copy`; hot: the backend's).
  // REQUIRES: layer.mu held.
  absl::Status VerifyLayerPages(const LayerState& layer, Copy copy, const LayerName& name, ChecksumSite site) const;
  // Window tokens [first, end) (indices into the window) of the layer;
  // `doing` says what the check guards ("read", "attended", "encoded into a
  // page", "written to the snapshot"). REQUIRES: layer.mu held.
  absl::Status VerifyWindow(const LayerState& layer, int64_t first, int64_t end, const LayerName& name,
                            absl::string_view doing) const;
  // The backend's checksums of the level form of `pages` (the hot pool).
  absl::Status HotSums(absl::Span<const PageId> pages, std::vector<PageChecksum>* sums) const;
  // The backend's checksums of cold pages (as encoded).
  absl::Status ColdSums(absl::Span<const PageId> pages, std::vector<PageChecksum>* sums) const;

  // Counts a failure found elsewhere (a snapshot's page on load).
  void CountFailure(ChecksumSite site) const;
  uint64_t failures() const { return failures_.load(); }

 private:
  absl::Status Mismatch(bool hot, size_t index, const LayerName& name, ChecksumSite site, PageChecksum expected,
                        PageChecksum computed) const;

  const PagePool& cold_;
  const PagePool* const hot_;
  Backend& backend_;
  Metrics* const metrics_;
  const size_t n_;
  mutable std::atomic<uint64_t> failures_{0};
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PAGE_VERIFIER_H_
