#include "backends/page_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace driftkv {

std::vector<std::string> PageFormatNames() {
  return {kContainerPageFormat};
}

absl::StatusOr<PageLayout> MakePageLayoutFor(const std::string& name, const KvCodec& codec) {
  if (name == kContainerPageFormat) {
    // One block of the codec per page; the side record is D-Quant's mean
    // record (DQuantCodec::page_layout() gives the same layout).
    return MakePageLayout(codec.block_tokens(), codec.kv_heads(), codec.head_dim(),
                          static_cast<int>(codec.key_stride()), static_cast<int>(codec.value_stride()),
                          static_cast<int>(codec.side_stride()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("page format \"", name, "\" unknown (known: ", absl::StrJoin(PageFormatNames(), ", "), ")"));
}

}  // namespace driftkv
