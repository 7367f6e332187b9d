// The data of one stored sequence: per model layer, the ids of its full
// pages (oldest first) and a bf16 window of the newest tokens. Plain data:
// SequenceTable (service/sequence_table.h) creates, finds and frees
// sequences, HotTier (service/hot_tier.h) moves a layer's pages between
// the tiers, Handler (service/handler.h) appends and attends.
//
// Invariants of a layer with `length` tokens (P = page_tokens, R =
// window_tokens of the config):
//   length = pages.size() * P + window tokens,
//   window tokens in [0, R + P), and >= R once any page was encoded by
//   the layer's own appends; a forked layer (Handler::Fork) starts with
//   its source's first pages and an empty window, and holds fewer than R
//   window tokens until appends fill it;
//   page i holds tokens [i P, (i + 1) P) = one key-mean window;
//   page_sums.size() == pages.size(); digests.size() == pages.size() * P;
//   hot_sums.size() == pages.size() while hot, empty while cold;
//   window_sums.size() == window tokens.
// When an append makes the window hold >= R + P tokens, its oldest P tokens
// are encoded into a new page, as often as needed. Encoding reads the bf16
// values, so a token's stored form does not depend on how it was chunked.
// So a fork of k pages that is appended the rest of L tokens holds exactly
// the pages and window of a sequence given all L tokens, as long as k is
// at most that sequence's pages: (L - R) / P rounded down, when L >= R + P.
// Pages may be shared by several sequences' layers (Fork), each holding one
// reference (backends/page_pool.h, REFERENCES): a page's bytes never change
// once written, and a layer frees only its own references (release, tier
// moves).
//
// Locks (the order across all of the service is in service/handler.h):
//   Sequence::mu    readers: any operation on the sequence's layers;
//                   writer: release, expiry, dropping a failed new sequence
//                   (which therefore wait for operations in flight);
//   LayerState::mu  readers: Attend (without steps) and Read of the layer;
//                   writer: Append, decode steps and tier moves of the layer.
// A holder of a stale pointer sees `released` and answers NOT_FOUND.
#ifndef DRIFTKV_SERVICE_SEQUENCE_H_
#define DRIFTKV_SERVICE_SEQUENCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/page_checksum.h"
#include "backends/page_pool.h"
#include "service/hot_sums.h"
#include "service/page_key.h"
#include "service/tenant.h"

namespace driftkv {

// The service's clock (TTLs, tombstones, the hot tier's idle time); tests
// pass a fake one.
using ServiceClock = std::function<absl::Time()>;

// One model layer of one sequence. Fields guarded by mu, or by the
// sequence's mu held as a writer.
struct LayerState {
  // Unique for the process's life (AttendJob::window_id; the hot tier's key).
  const uint64_t id = NewId();
  absl::Mutex mu;
  std::vector<PageId> pages;
  // CRC-32C of each page's cold form (backends/page_checksum.h), parallel
  // to `pages` in either tier: tier moves keep the bytes' cold form.
  std::vector<PageChecksum> page_sums;
  // CRC-32C of each page's level form while the layer is hot (parallel to
  // `pages`), recorded at promotion from the bytes the backend holds, after
  // the cold page was checked (service/hot_sums.h: possibly still being
  // computed by the backend); empty while cold.
  HotSums hot_sums;
  std::vector<uint16_t> window_keys;  // bf16 [window tokens][n]
  std::vector<uint16_t> window_values;
  // WindowTokenSum (service/page_verifier.h) of each window token: a token
  // entering the window adds its CRC, one leaving for a page takes its CRC
  // away (checked first), so a decode step sums one token's 4 n bytes.
  std::vector<PageChecksum> window_sums;
  // TokenDigest of every paged token (pages.size() * P entries, token
  // order), for comparing repeated Appends (service/token_digest.h).
  std::vector<uint64_t> digests;
  int64_t length = 0;
  // `pages` are level pages of the hot pool (service/hot_tier.h); a cold
  // layer with no pages is hot once attended, so its first page goes hot.
  bool hot = false;
  // Async hot tier: a promotion of this layer is queued (coalesces).
  std::atomic<bool> promotion_queued{false};

  static uint64_t NewId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
};

// The token ids a sequence was given (AppendChunk.token_ids), shared by
// its layers, and the page keys they name (service/page_key.h). Ids of
// tokens [ids_begin, ids_begin + ids.size()) are kept, so that a layer's
// chunk can be compared with what another layer's chunk said; keys[k] is
// the key of page k for every page whose ids are all known
// (keys.size() = (ids_begin + ids.size()) / P). ids_begin is 0 unless the
// sequence was forked from page keys (whose ids the server never saw).
// `closed`: tokens were stored past the last known id without ids; no id
// is added from then on (the sequence is unhashed from that page on).
// 4 bytes per token and 16 per page: small beside the tokens' pages.
struct TokenIds {
  absl::Mutex mu;  // a leaf below LayerState::mu, above the prefix index's
  int64_t ids_begin ABSL_GUARDED_BY(mu) = 0;
  std::vector<uint32_t> ids ABSL_GUARDED_BY(mu);
  std::vector<PageKey> keys ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
  int64_t end() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return ids_begin + static_cast<int64_t>(ids.size()); }
};

struct Sequence {
  Sequence(std::string key, int layers, TenantUsage* usage, int device)
      : id(std::move(key)), usage(usage), device(device), layers(layers) {}
  const std::string id;      // the table key: TenantKey(tenant, sequence_id)
  TenantUsage* const usage;  // its tenant's (the table's ledger owns it)
  // The pool partition (device slot, options.devices[device]) that holds
  // every page of the sequence: chosen at creation, least loaded, and
  // kept (PARTITIONS in backends/page_pool.h).
  const int device;
  absl::Mutex mu;
  std::vector<LayerState> layers;  // fixed size; see LayerState
  TokenIds token_ids;
  bool released ABSL_GUARDED_BY(mu) = false;
  std::atomic<int64_t> last_access_ns{0};
  // THE LEVELS BELOW THE POOL (service/spill_tier.h, PINS). `below`: every
  // layer's pages are on a level below (each entry of pages is
  // kPageBelow): the host level's slots `below_keys` when `below_on_host`,
  // else the disk level's keys (layer-major either way); the three change
  // only under mu held as a writer. `below_hint` is set before a move down
  // checks the pins; `spill_pins` counts requests using the sequence
  // (never moved down).
  bool below ABSL_GUARDED_BY(mu) = false;
  bool below_on_host ABSL_GUARDED_BY(mu) = false;
  std::vector<uint64_t> below_keys ABSL_GUARDED_BY(mu);
  std::atomic<bool> below_hint{false};
  std::atomic<int> spill_pins{0};
};
using SequencePtr = std::shared_ptr<Sequence>;

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SEQUENCE_H_
