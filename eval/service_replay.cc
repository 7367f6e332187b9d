#include "eval/service_replay.h"

#include "absl/strings/str_cat.h"
#include "wire/half.h"

namespace driftkv {

absl::StatusOr<ServiceReplay> ServiceReplay::Encode(const DQuantCodec& codec, int window_tokens, const float* keys,
                                                    const float* values, int64_t tokens) {
  ServiceReplay r(codec, window_tokens, keys, values);
  const int n = codec.n(), p = codec.config().mean_window;
  const int64_t pages = tokens / p;
  r.key_records_.resize(static_cast<size_t>(pages) * p * codec.key_stride());
  r.value_records_.resize(static_cast<size_t>(pages) * p * codec.value_stride());
  r.mean_records_.resize(static_cast<size_t>(pages) * codec.mean_stride());
  std::vector<float> kb(static_cast<size_t>(p) * n), vb(kb.size());
  CodecScratch scratch;
  StreamStats ks, vs;
  for (int64_t j = 0; j < pages; ++j) {
    for (size_t e = 0; e < kb.size(); ++e) {
      kb[e] = Bf16ToFloat(FloatToBf16(keys[static_cast<size_t>(j) * p * n + e]));
      vb[e] = Bf16ToFloat(FloatToBf16(values[static_cast<size_t>(j) * p * n + e]));
    }
    absl::Status st = codec.EncodeWindow(
        kb.data(), vb.data(), p, r.key_records_.data() + static_cast<size_t>(j) * p * codec.key_stride(),
        r.value_records_.data() + static_cast<size_t>(j) * p * codec.value_stride(),
        r.mean_records_.data() + static_cast<size_t>(j) * codec.mean_stride(), &scratch, &ks, &vs);
    if (!st.ok()) return st;
  }
  return r;
}

absl::Status ServiceReplay::Attend(int64_t tokens, const float* query, int q_heads, float softmax_scale, float* out,
                                   float* lse, AttentionScratch* scratch) const {
  const DQuantCodec& c = *codec_;
  const int n = c.n(), p = c.config().mean_window;
  const int64_t pages = StoredPages(tokens, window_tokens_, p);
  if (static_cast<size_t>(pages) * p * c.key_stride() > key_records_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay of ", tokens, " tokens: only ", key_records_.size() / c.key_stride(), " were encoded"));
  }
  std::vector<CompressedBlock> blocks;
  for (int64_t j = 0; j < pages; ++j) {
    blocks.push_back({key_records_.data() + static_cast<size_t>(j) * p * c.key_stride(),
                      value_records_.data() + static_cast<size_t>(j) * p * c.value_stride(),
                      mean_records_.data() + static_cast<size_t>(j) * c.mean_stride(), p});
  }
  const int64_t w = tokens - pages * p;
  std::vector<uint16_t> wk(static_cast<size_t>(w) * n), wv(wk.size());
  for (size_t e = 0; e < wk.size(); ++e) {
    wk[e] = FloatToBf16(keys_[static_cast<size_t>(pages) * p * n + e]);
    wv[e] = FloatToBf16(values_[static_cast<size_t>(pages) * p * n + e]);
  }
  return CompressedAttention(c, blocks, Bf16Tokens{wk.data(), wv.data(), w}, query, q_heads, softmax_scale, out, lse,
                             scratch);
}

}  // namespace driftkv
