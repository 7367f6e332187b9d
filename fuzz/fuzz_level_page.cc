// libFuzzer: the hot tier's level pages (codec/level_page.h). The input is
// a level page of the small codec: decoding must fail cleanly (DataLoss for
// a level outside the alphabet) or give tokens; a page that demotes to cold
// records must promote back, and demote again to the same bytes.
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/host_decode.h"
#include "codec/level_page.h"
#include "fuzz/fuzz_util.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DQuantCodec& codec = fuzz::SmallCodec();
  static const LevelPageLayout level = *MakeLevelPageLayout(codec);
  std::vector<uint8_t> page(level.page_bytes, 0);
  std::memcpy(page.data(), data, std::min(size, page.size()));
  const int p = codec.config().mean_window, n = codec.n();
  std::vector<float> keys(p * n), values(p * n);
  CodecScratch scratch;
  const int tokens = size > 0 ? 1 + data[0] % p : p;
  (void)DecodeLevelPageTokens(codec, level, page.data(), 0, 0, tokens, nullptr, false, keys.data(), values.data(),
                              &scratch);
  const PageLayout l = codec.page_layout();
  std::vector<uint8_t> cold(l.page_bytes), again(l.page_bytes), hot(level.page_bytes);
  if (!DemotePage(codec, level, page.data(), tokens, cold.data(), cold.data() + l.value_offset,
                  cold.data() + l.mean_offset)
           .ok()) {
    return 0;
  }
  absl::Status promoted = PromotePage(codec, level, cold.data(), cold.data() + l.value_offset,
                                      cold.data() + l.mean_offset, tokens, hot.data());
  if (!promoted.ok()) {
    std::fprintf(stderr, "demoted records do not promote: %s\n", promoted.ToString().c_str());
    __builtin_trap();  // demoted records always decode
  }
  if (!DemotePage(codec, level, hot.data(), tokens, again.data(), again.data() + l.value_offset,
                  again.data() + l.mean_offset)
           .ok()) {
    __builtin_trap();
  }
  // Only the tokens' records and the mean record are defined.
  const size_t key_bytes = static_cast<size_t>(tokens) * codec.key_stride();
  const size_t value_bytes = static_cast<size_t>(tokens) * codec.value_stride();
  if (std::memcmp(cold.data(), again.data(), key_bytes) != 0 ||
      std::memcmp(cold.data() + l.value_offset, again.data() + l.value_offset, value_bytes) != 0 ||
      std::memcmp(cold.data() + l.mean_offset, again.data() + l.mean_offset, codec.mean_stride()) != 0) {
    __builtin_trap();
  }
  return 0;
}
