// Page representations by name (the config's codec.page_format, reported
// by Info): how a codec's records sit in the pages of the arena. A new
// representation is a new entry here plus the backends that can attend to
// it; the handler only sees a PageLayout's page size and tokens per page.
//
//   "container"  fixed-size records per token and one side record per page
//                of block_tokens() tokens (codec/page_layout.h); every
//                KvCodec has it, and D-Quant's is THE page layout of the
//                CPU and CUDA backends.
#ifndef DRIFTKV_BACKENDS_PAGE_FORMAT_H_
#define DRIFTKV_BACKENDS_PAGE_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/kv_codec.h"
#include "codec/page_layout.h"

namespace driftkv {

constexpr char kContainerPageFormat[] = "container";

// The names MakePageLayoutFor accepts.
std::vector<std::string> PageFormatNames();

// The page layout of `codec`'s records in format `name`; InvalidArgument
// naming the known formats when `name` is unknown.
absl::StatusOr<PageLayout> MakePageLayoutFor(const std::string& name, const KvCodec& codec);

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_PAGE_FORMAT_H_
