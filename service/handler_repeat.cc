// Handler::CheckRepeat: tokens sent again must equal the stored ones.
// A retry resends the same bytes; different bytes for stored positions mean
// a mismatched producer (another prompt, another model, a bug), which must
// not be acknowledged as a duplicate.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"
#include "service/token_digest.h"
#include "wire/half.h"

namespace driftkv {

using handler_internal::Quoted;

absl::Status Handler::CheckRepeat(const LayerState& layer, uint64_t first, int64_t count, const HostTokens& tokens,
                                  absl::string_view where, const std::string& id, uint32_t layer_index) const {
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  const int64_t paged = static_cast<int64_t>(layer.pages.size()) * p;
  // Digests exist for every paged token this process encoded from the
  // host; a layer restored without them has fewer, and tokens encoded from
  // device staging have kNoDigest: those tokens are not compared.
  const int64_t digested = std::min<int64_t>(paged, static_cast<int64_t>(layer.digests.size()));
  std::vector<uint16_t> k(n), v(n);
  int64_t bad_first = -1, bad_last = -1, bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = static_cast<int64_t>(first) + i;
    tokens.CopyBf16(i * n, n, k.data(), v.data());
    bool same = true;
    if (t < paged) {
      same = t >= digested || layer.digests[t] == kNoDigest || TokenDigest(k.data(), v.data(), n) == layer.digests[t];
    } else {
      const size_t w = static_cast<size_t>(t - paged) * n;
      same = std::equal(k.begin(), k.end(), layer.window_keys.begin() + w) &&
             std::equal(v.begin(), v.end(), layer.window_values.begin() + w);
    }
    if (!same) {
      if (bad_first < 0) bad_first = t;
      bad_last = t;
      ++bad;
    }
  }
  if (bad == 0) return absl::OkStatus();
  metrics_->integrity_rejections[kRejectRepeat]->Increment();
  return absl::AlreadyExistsError(absl::StrCat(where, " of tokens [", bad_first, ", ", bad_last + 1, ") of layer ",
                                               layer_index, " of sequence_id ", Quoted(id),
                                               " differ from the stored tokens (", bad, " of ", count,
                                               " repeated tokens differ, compared as bf16); nothing stored"));
}

absl::Status Handler::CheckRepeatChunk(const LayerState& layer, uint64_t first, int64_t count, const float* keys,
                                       const float* values, const StagedTokens* staged, const std::string& id,
                                       uint32_t layer_index) const {
  if (staged == nullptr) {
    return CheckRepeat(layer, first, count, HostTokens{keys, values}, "keys/values", id, layer_index);
  }
  std::vector<float> k(static_cast<size_t>(count) * n()), v(k.size());
  absl::Status st = backend_->CopyStagedToHost(*staged, static_cast<int>(n()), count, k.data(), v.data());
  if (!st.ok()) return st;
  return CheckRepeat(layer, first, count, HostTokens{k.data(), v.data()}, "keys/values", id, layer_index);
}

}  // namespace driftkv
