// libFuzzer: the record/page parser. The input is a cold page (key records,
// value records, mean record; codec/page_layout.h) of the small codec:
// decoding it must fail cleanly or give tokens, never read out of bounds;
// a page that promotes to a level page and demotes back must decode to the
// same floats bit for bit.
#include <cstring>
#include <vector>

#include "backends/host_decode.h"
#include "backends/page_pool.h"
#include "codec/level_page.h"
#include "fuzz/fuzz_util.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DQuantCodec& codec = fuzz::SmallCodec();
  static std::unique_ptr<PagePool> pool = [&] {
    absl::StatusOr<std::unique_ptr<PagePool>> p =
        PagePool::Create(codec.page_layout(), 2 * codec.page_layout().page_bytes);
    if (!p.ok()) std::abort();
    return *std::move(p);
  }();
  static const LevelPageLayout level = *MakeLevelPageLayout(codec);
  const size_t page_bytes = pool->page_stride();
  std::memset(pool->page(0), 0, page_bytes);
  std::memcpy(pool->page(0), data, std::min(size, page_bytes));
  const int p = codec.config().mean_window, n = codec.n();
  std::vector<float> k1(p * n), v1(p * n), k2(p * n), v2(p * n);
  CodecScratch scratch;
  const int first = size > 0 ? data[0] % p : 0;
  absl::Status st = DecodePageTokens(codec, *pool, 0, first, p - first, nullptr, false, k1.data(), v1.data(), &scratch);
  (void)st;
  st = DecodePageTokens(codec, *pool, 0, 0, p, nullptr, false, k1.data(), v1.data(), &scratch);
  if (!st.ok()) return 0;
  std::vector<uint8_t> hot(level.page_bytes);
  const PageLayout& l = pool->layout();
  if (!PromotePage(codec, level, pool->key_records(0), pool->value_records(0), pool->mean_record(0), p, hot.data())
           .ok()) {
    __builtin_trap();  // every record decoded above: promotion must too
  }
  std::memset(pool->page(1), 0xA5, page_bytes);
  uint8_t* cold = pool->page(1);
  if (!DemotePage(codec, level, hot.data(), p, cold, cold + l.value_offset, cold + l.mean_offset).ok()) return 0;
  if (!DecodePageTokens(codec, *pool, 1, 0, p, nullptr, false, k2.data(), v2.data(), &scratch).ok()) __builtin_trap();
  if (std::memcmp(k1.data(), k2.data(), k1.size() * 4) != 0 || std::memcmp(v1.data(), v2.data(), v1.size() * 4) != 0) {
    __builtin_trap();
  }
  return 0;
}
