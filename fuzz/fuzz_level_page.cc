// libFuzzer: the hot tier's level pages (codec/level_page.h). The input is
// a level page of the small codec (its first bytes; the rest of the page is
// zero): decoding must fail cleanly (DataLoss for a level outside the
// alphabet or a grid no encoder writes) or give tokens; a page that demotes
// to cold records must promote back, and demote again to the same bytes.
//
// Speed: the work per input grows with the tokens demoted and promoted
// (each is a rANS code of n levels, three times), so the first byte picks
// few tokens: 1 + b % 16 (one 16-token m-tile of the fragment layout) for
// most bytes, and b + 1 (121-128, the last m-tile reached) for b in
// [120, 127], one byte value in 32; the committed reproducers start with
// 127 (all 128 tokens). The host decoder (a Hadamard rotation per token)
// decodes at most kDecodeTokens of them, from the token the second byte
// picks, so that every token position of the page is still read.
// Inputs longer than the page return at once (-1: newer libFuzzers then
// keep them out of the corpus; Debian's clang 14 reads it as 0), and every
// buffer is allocated once.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/host_decode.h"
#include "codec/level_page.h"
#include "fuzz/fuzz_util.h"

using namespace driftkv;

namespace {

constexpr int kSmallTokens = 16;     // one m-tile
constexpr uint8_t kFullFirst = 120;  // bytes [120, 127] pick 121-128 tokens
constexpr uint8_t kFullLast = kLevelPageTokens - 1;
constexpr int kDecodeTokens = 2;

int TokenCount(uint8_t b) {
  return b >= kFullFirst && b <= kFullLast ? b + 1 : 1 + b % kSmallTokens;
}

// Buffers sized once for the codec, reused by every input.
struct Buffers {
  explicit Buffers(const DQuantCodec& codec)
      : level(*MakeLevelPageLayout(codec)),
        cold_layout(codec.page_layout()),
        page(level.page_bytes),
        hot(level.page_bytes),
        keys(static_cast<size_t>(kLevelPageTokens) * codec.n()),
        values(keys.size()),
        cold(cold_layout.page_bytes),
        again(cold_layout.page_bytes) {}
  LevelPageLayout level;
  PageLayout cold_layout;
  std::vector<uint8_t> page, hot;
  std::vector<float> keys, values;
  std::vector<uint8_t> cold, again;
  CodecScratch scratch;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DQuantCodec& codec = fuzz::SmallCodec();
  static Buffers* const b = new Buffers(codec);
  if (size > b->page.size()) return -1;
  std::memcpy(b->page.data(), data, size);
  std::memset(b->page.data() + size, 0, b->page.size() - size);
  const int tokens = size > 0 ? TokenCount(data[0]) : kLevelPageTokens;
  const int first = size > 1 ? data[1] % tokens : 0;
  const int count = std::min(kDecodeTokens, tokens - first);
  (void)DecodeLevelPageTokens(codec, b->level, b->page.data(), 0, first, count, nullptr, false, b->keys.data(),
                              b->values.data(), &b->scratch);
  const PageLayout& l = b->cold_layout;
  uint8_t* cold = b->cold.data();
  uint8_t* again = b->again.data();
  if (!DemotePage(codec, b->level, b->page.data(), tokens, cold, cold + l.value_offset, cold + l.mean_offset).ok()) {
    return 0;
  }
  absl::Status promoted =
      PromotePage(codec, b->level, cold, cold + l.value_offset, cold + l.mean_offset, tokens, b->hot.data());
  if (!promoted.ok()) {
    std::fprintf(stderr, "demoted records do not promote: %s\n", promoted.ToString().c_str());
    __builtin_trap();  // demoted records always decode
  }
  if (!DemotePage(codec, b->level, b->hot.data(), tokens, again, again + l.value_offset, again + l.mean_offset).ok()) {
    __builtin_trap();
  }
  // Only the tokens' records and the mean record are defined.
  const size_t key_bytes = static_cast<size_t>(tokens) * codec.key_stride();
  const size_t value_bytes = static_cast<size_t>(tokens) * codec.value_stride();
  if (std::memcmp(cold, again, key_bytes) != 0 ||
      std::memcmp(cold + l.value_offset, again + l.value_offset, value_bytes) != 0 ||
      std::memcmp(cold + l.mean_offset, again + l.mean_offset, codec.mean_stride()) != 0) {
    __builtin_trap();
  }
  return 0;
}
