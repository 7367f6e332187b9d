// A sequence's token ids (TokenIds, service/sequence.h) as chunks give
// them: compared with what other chunks said, extended, and the page keys
// they complete computed (service/page_key.h).
#ifndef DRIFTKV_SERVICE_TOKEN_IDS_H_
#define DRIFTKV_SERVICE_TOKEN_IDS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "service/sequence.h"

namespace driftkv {

// What AcceptTokenIds changed, for UndoTokenIds.
struct TokenIdsChange {
  size_t ids = 0, keys = 0;  // sizes before
  size_t new_ids = 0;        // size after
  bool closed_now = false;   // it closed the ids
  PageKey unhashed_after;    // when closed_now: the key of the last keyed page (or the root)
};

// A chunk of `count` tokens at `first` with `ids` (count of them, or none)
// whose fresh tokens (those it stores) end at first + count when `fresh`.
// With ids: ALREADY_EXISTS naming the range where they differ from the
// ids held (nothing changed), else extends the ids and the keys of the
// pages they complete (P = page_tokens). Without: closes the ids when the
// chunk stores tokens past the last known id. REQUIRES: t->mu held.
absl::Status AcceptTokenIds(TokenIds* t, uint64_t first, uint32_t count, absl::Span<const uint32_t> ids, bool fresh,
                            int page_tokens, const std::string& sequence_id, uint32_t layer, TokenIdsChange* change)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu);
// Undoes `change` unless a later change built on it. REQUIRES: t->mu held.
void UndoTokenIds(TokenIds* t, const TokenIdsChange& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu);
// The first `tokens` tokens' ids and keys of `from`, for a fork of them
// (whole pages). REQUIRES: from.mu held; `to` seen by no one else.
void CopyTokenIds(const TokenIds& from, int64_t tokens, int page_tokens, TokenIds* to)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(from.mu) ABSL_NO_THREAD_SAFETY_ANALYSIS;

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TOKEN_IDS_H_
