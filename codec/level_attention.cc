#include "codec/level_attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/level_page.h"
#include "wire/half.h"

namespace driftkv {
namespace {

constexpr size_t kCacheLineBytes = 64;

void Prefetch(const uint8_t* p, size_t bytes) {
  for (size_t b = 0; b < bytes; b += kCacheLineBytes) __builtin_prefetch(p + b);
}

}  // namespace

absl::Status LevelAttention(const DQuantCodec& codec, absl::Span<const LevelPageRef> pages, const Bf16Tokens& window,
                            const float* query, int q_heads, float softmax_scale, float* out, float* lse,
                            LevelAttentionScratch* s) {
  absl::StatusOr<LevelPageLayout> layout = MakeLevelPageLayout(codec);
  if (!layout.ok()) return layout.status();
  AttentionCore core(codec, &s->attention);
  absl::Status st = core.Begin(query, q_heads, softmax_scale);
  if (!st.ok()) return st;
  const size_t n = codec.n();
  s->key_levels.resize(kLevelPageTokens * n);
  s->value_levels.resize(kLevelPageTokens * n);
  s->key_headers.resize(kLevelPageTokens);
  s->value_headers.resize(kLevelPageTokens);
  s->mean_record.resize(kMeanHeaderBytes + n);
  for (std::vector<float>* v : {&s->key_scale, &s->key_offset, &s->value_scale, &s->value_offset}) {
    v->resize(kLevelPageTokens);
  }
  const size_t window_bytes = static_cast<size_t>(window.tokens) * n * sizeof(uint16_t);  // keys, as values
  for (size_t p = 0; p < pages.size(); ++p) {
    const int tokens = pages[p].tokens;
    if (tokens < 1 || tokens > kLevelPageTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("level page ", p, ": tokens ", tokens, " out of range [1, ", kLevelPageTokens, "]"));
    }
    UnpackLevelPage(*layout, pages[p].page, s->key_levels.data(), s->value_levels.data(), s->key_headers.data(),
                    s->value_headers.data(), s->mean_record.data());
    // The next page, and a share of the bf16 window, on their way into the
    // caches while this page is attended: a decode step finds its pages in
    // memory, not in cache, and the unpacking reads a page in strides the
    // hardware does not foresee.
    if (p + 1 < pages.size()) Prefetch(pages[p + 1].page, layout->page_bytes);
    if (window_bytes > 0) {
      const size_t share = window_bytes / pages.size(), from = p * share;
      const size_t bytes = p + 1 < pages.size() ? share : window_bytes - from;
      Prefetch(reinterpret_cast<const uint8_t*>(window.keys) + from, bytes);
      Prefetch(reinterpret_cast<const uint8_t*>(window.values) + from, bytes);
    }
    for (int t = 0; t < tokens; ++t) {
      const bool key_ok = LevelHeaderGrid(s->key_headers[t], &s->key_scale[t], &s->key_offset[t]);
      if (!key_ok || !LevelHeaderGrid(s->value_headers[t], &s->value_scale[t], &s->value_offset[t])) {
        return absl::DataLossError(absl::StrCat("level page ", p, ": ", key_ok ? "value" : "key",
                                                " grid (scale/offset) of token ", t, " is not finite"));
      }
    }
    core.BeginBlock(s->mean_record.data(), tokens);
    core.KeyTokens(0, tokens, s->key_levels.data(), s->key_scale.data(), s->key_offset.data());
    core.EndKeys();
    core.ValueTokens(0, tokens, s->value_levels.data(), s->value_scale.data(), s->value_offset.data());
  }
  core.Window(window);
  core.Finish(out, lse);
  return absl::OkStatus();
}

}  // namespace driftkv
