#include "service/page_verifier.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/quoted.h"

namespace driftkv {

absl::Status PageVerifier::Verify(const LayerState& layer, size_t index, PageId page, const std::string& id,
                                  int layer_index, ChecksumSite site) const {
  const PageChecksum computed = Crc32c(pool_.page(page), pool_.page_stride());
  if (computed == layer.page_sums[index]) return absl::OkStatus();
  CountFailure(site);
  const int64_t p = pool_.page_tokens();
  std::string where =
      id.empty() ? "a hot layer being demoted" : absl::StrCat("layer ", layer_index, " of sequence_id ", Quoted(id));
  return absl::DataLossError(absl::StrFormat(
      "page %d (tokens [%d, %d)) of %s fails its checksum: stored crc32c %08x, computed %08x; the page is "
      "corrupt and is not served",
      index, static_cast<int64_t>(index) * p, static_cast<int64_t>(index + 1) * p, where, layer.page_sums[index],
      computed));
}

void PageVerifier::CountFailure(ChecksumSite site) const {
  ++failures_;
  metrics_->checksum_failures[site]->Increment();
}

}  // namespace driftkv
