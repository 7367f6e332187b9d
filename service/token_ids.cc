#include "service/token_ids.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "service/quoted.h"

namespace driftkv {

absl::Status AcceptTokenIds(TokenIds* t, uint64_t first, uint32_t count, absl::Span<const uint32_t> ids, bool fresh,
                            int page_tokens, const std::string& sequence_id, uint32_t layer, TokenIdsChange* change) {
  const int64_t f = static_cast<int64_t>(first), e = f + count, end = t->end();
  change->ids = change->new_ids = t->ids.size();
  change->keys = t->keys.size();
  if (!ids.empty()) {
    const int64_t from = std::max(f, t->ids_begin), to = std::min(e, end);
    for (int64_t i = from; i < to; ++i) {
      const uint32_t held = t->ids[i - t->ids_begin], given = ids[i - f];
      if (held != given) {
        return absl::AlreadyExistsError(absl::StrCat("token_ids of tokens [", from, ", ", to, ") of layer ", layer,
                                                     " contradict the ids sequence_id ", Quoted(sequence_id),
                                                     " holds for them: token ", i, " holds id ", held,
                                                     ", the chunk says ", given, "; nothing stored"));
      }
    }
  }
  if (t->closed || e <= end) return absl::OkStatus();
  if (ids.empty() || f > end) {
    // Tokens past the last known id arrive (or arrived) without ids.
    if (ids.empty() && !fresh) return absl::OkStatus();
    t->closed = true;
    change->closed_now = true;
    change->unhashed_after = t->keys.empty() ? PageKeyRoot() : t->keys.back();
    return absl::OkStatus();
  }
  t->ids.insert(t->ids.end(), ids.begin() + (end - f), ids.end());
  change->new_ids = t->ids.size();
  const int64_t p = page_tokens;
  while (static_cast<int64_t>(t->keys.size() + 1) * p <= t->end()) {
    const int64_t k = static_cast<int64_t>(t->keys.size());
    const PageKey& parent = k == 0 ? PageKeyRoot() : t->keys[k - 1];
    t->keys.push_back(NextPageKey(parent, absl::MakeConstSpan(t->ids).subspan(k * p - t->ids_begin, p)));
  }
  return absl::OkStatus();
}

void UndoTokenIds(TokenIds* t, const TokenIdsChange& c) {
  if (c.closed_now) t->closed = false;
  if (c.new_ids != c.ids && t->ids.size() == c.new_ids) {
    t->ids.resize(c.ids);
    t->keys.resize(c.keys);
  }
}

void CopyTokenIds(const TokenIds& from, int64_t tokens, int page_tokens, TokenIds* to) {
  const int64_t pages = tokens / page_tokens;
  to->keys.assign(from.keys.begin(), from.keys.begin() + std::min<int64_t>(pages, from.keys.size()));
  to->ids_begin = std::min(from.ids_begin, tokens);
  const int64_t kept = std::max<int64_t>(0, std::min(tokens, from.end()) - from.ids_begin);
  to->ids.assign(from.ids.begin(), from.ids.begin() + kept);
  // Tokens of the fork whose ids the source never had: unhashed.
  to->closed = from.end() < tokens;
}

}  // namespace driftkv
