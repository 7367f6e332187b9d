#include "service/page_verifier.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/quoted.h"

namespace driftkv {

namespace {

std::string Describe(const LayerName& name) {
  return absl::StrCat("layer ", name.layer, " of sequence_id ", Quoted(name.sequence_id));
}

// What became of the corrupt page: the path refuses to go on with it.
const char* Outcome(ChecksumSite site) {
  switch (site) {
    case kCheckPromote: return "is not promoted";
    case kCheckDemote: return "is not demoted";
    case kCheckSnapshot: return "is not written";
    default: return "is not served";
  }
}

}  // namespace

absl::Status PageVerifier::Mismatch(bool hot, size_t index, const LayerName& name, ChecksumSite site,
                                    PageChecksum expected, PageChecksum computed) const {
  CountFailure(site);
  const int64_t p = cold_.page_tokens();
  return absl::DataLossError(absl::StrFormat(
      "%spage %d (tokens [%d, %d)) of %s fails %s: stored crc32c %08x, computed %08x; the page is corrupt and %s",
      hot ? "hot " : "", index, static_cast<int64_t>(index) * p, static_cast<int64_t>(index + 1) * p, Describe(name),
      hot ? "the checksum of its hot form" : "its checksum", expected, computed, Outcome(site)));
}

absl::Status PageVerifier::ColdSums(absl::Span<const PageId> pages, std::vector<PageChecksum>* sums) const {
  sums->resize(pages.size());
  return backend_.ChecksumPages(cold_, pages, sums->data());
}

absl::Status PageVerifier::HotSums(absl::Span<const PageId> pages, std::vector<PageChecksum>* sums) const {
  if (hot_ == nullptr) return absl::FailedPreconditionError("hot page checksums without a hot tier");
  sums->resize(pages.size());
  return backend_.ChecksumPages(*hot_, pages, sums->data());
}

absl::Status PageVerifier::VerifyColdPages(absl::Span<const PageId> pages, absl::Span<const PageChecksum> expected,
                                           size_t first, Copy copy, const LayerName& name, ChecksumSite site) const {
  thread_local std::vector<PageChecksum> computed;
  if (copy == Copy::kBackend) {
    if (absl::Status st = ColdSums(pages, &computed); !st.ok()) return st;
  } else {
    computed.resize(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) computed[i] = Crc32c(cold_.page(pages[i]), cold_.page_stride());
  }
  return CheckColdSums(computed, expected, first, name, site);
}

absl::Status PageVerifier::CheckColdSums(absl::Span<const PageChecksum> computed,
                                         absl::Span<const PageChecksum> expected, size_t first, const LayerName& name,
                                         ChecksumSite site) const {
  for (size_t i = 0; i < computed.size(); ++i) {
    if (computed[i] != expected[i]) return Mismatch(false, first + i, name, site, expected[i], computed[i]);
  }
  return absl::OkStatus();
}

absl::Status PageVerifier::VerifyHotPages(absl::Span<const PageId> pages, absl::Span<const PageChecksum> expected,
                                          size_t first, const LayerName& name, ChecksumSite site) const {
  thread_local std::vector<PageChecksum> computed;
  if (absl::Status st = HotSums(pages, &computed); !st.ok()) return st;
  return CheckHotSums(computed, expected, first, name, site);
}

absl::Status PageVerifier::CheckHotSums(absl::Span<const PageChecksum> computed,
                                        absl::Span<const PageChecksum> expected, size_t first, const LayerName& name,
                                        ChecksumSite site) const {
  for (size_t i = 0; i < computed.size(); ++i) {
    if (computed[i] != expected[i]) return Mismatch(true, first + i, name, site, expected[i], computed[i]);
  }
  return absl::OkStatus();
}

absl::Status PageVerifier::VerifyLayerPages(const LayerState& layer, Copy copy, const LayerName& name,
                                            ChecksumSite site) const {
  if (layer.hot) {
    std::vector<PageChecksum> joined;
    absl::StatusOr<absl::Span<const PageChecksum>> sums = layer.hot_sums.View(&joined);
    if (!sums.ok()) return sums.status();
    return VerifyHotPages(layer.pages, *sums, 0, name, site);
  }
  return VerifyColdPages(layer.pages, layer.page_sums, 0, copy, name, site);
}

absl::Status PageVerifier::VerifyWindow(const LayerState& layer, int64_t first, int64_t end, const LayerName& name,
                                        absl::string_view doing) const {
  for (int64_t t = first; t < end; ++t) {
    const PageChecksum computed = WindowTokenSum(&layer.window_keys[t * n_], &layer.window_values[t * n_], n_);
    if (computed == layer.window_sums[t]) continue;
    CountFailure(kCheckWindow);
    const int64_t paged = static_cast<int64_t>(layer.pages.size()) * cold_.page_tokens();
    return absl::DataLossError(absl::StrFormat(
        "token %d (window token %d of tokens [%d, %d)) of the bf16 window of %s fails its checksum: stored crc32c "
        "%08x, computed %08x; the window is corrupt and is not %s",
        paged + t, t, paged, layer.length, Describe(name), layer.window_sums[t], computed, doing));
  }
  return absl::OkStatus();
}

void PageVerifier::CountFailure(ChecksumSite site) const {
  ++failures_;
  metrics_->checksum_failures[site]->Increment();
}

}  // namespace driftkv
