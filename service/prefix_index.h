// The prefix index: full cold pages by content, (namespace, page key,
// layer) -> page (service/page_key.h; docs/prefix_cache.md, "The index").
//
// HOLDING. Each entry holds one reference to a page of the cold pool
// (PagePool::Retain, backends/page_pool.h): the page stays when the
// sequence that sealed it is released or moves the layer between tiers.
// Only cold pages are entered: a layer that is hot when its page is
// sealed gives the index the cold page it was encoded into (which the
// layer then frees), so while a layer is hot its indexed pages exist twice,
// hot in the layer and cold in the index; a promotion or demotion of a
// layer never changes the index. Entries are charged to no tenant.
//
// EVICTION. Entries form one LRU list (Insert and Take make an entry the
// most recent; Lookup does not). Evict walks it from the least recent
// end, freeing pages that only the index holds (PagePool::FreeIfLast) and
// moving the pages some sequence still holds to the most recent end, so a
// later walk reaches them last: a walk costs the pages it frees plus those
// it skips, and visits each entry at most once. The pool calls Evict when
// a Reserve falls short (its RECLAIMER).
//
// MISSES. The index remembers, for up to kRemembered of each, the
// (namespace, key, layer) it evicted and the (namespace, parent key) after
// which a sequence went on without token ids, to say why a page is not
// held; beyond that the oldest are forgotten (the sets are cleared when
// full) and such a page reads as never stored. It also remembers, the same
// way, each (namespace, parent key) after which some page was entered:
// a prompt whose page is not held although the page before it is, and
// another page followed that one, diverged (its tokens, or their hashing,
// differ from what was stored). And it counts the namespaces holding each
// key, to tell a page held under another namespace (another tenant or
// codec) from one never stored: that reason is for the server's metrics
// only, callers must be told "never stored" (service/tenant.h).
//
// Locks: mu_ is taken under any Sequence::mu or LayerState::mu (Append
// inserts under the layer's lock; Reserve reclaims under it) and only the
// pool's lock is taken under it.
#ifndef DRIFTKV_SERVICE_PREFIX_INDEX_H_
#define DRIFTKV_SERVICE_PREFIX_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "backends/page_checksum.h"
#include "backends/page_pool.h"
#include "service/page_events.h"
#include "service/page_key.h"

namespace driftkv {

class PrefixIndex {
 public:
  static constexpr size_t kRemembered = size_t{1} << 16;

  // Why page `pages` of a prompt is not held, in the order they are
  // tried: evicted (that page), unhashed (after the page before it),
  // diverged (another page followed the page before it), held under
  // another namespace only, never stored. kDiverged and kOtherNamespace
  // are only said of a page whose key the namespace holds in no layer.
  enum class Miss { kNone, kNeverStored, kEvicted, kUnhashed, kDiverged, kOtherNamespace };

  // A sealed page handed to the index: the cold page, its checksum and the
  // TokenDigest of each of its tokens (what a fork layer copies).
  struct Page {
    PageId page = -1;
    PageChecksum sum = 0;
    std::vector<uint64_t> digests;
  };
  // What Lookup and Take found for a prompt's keys.
  struct Match {
    std::vector<int64_t> layer_pages;  // leading pages held, per layer
    int64_t pages = 0;                 // held in every layer (min of layer_pages)
    Miss miss = Miss::kNone;           // of page `pages`, in layer miss_layer
    int miss_layer = 0;
  };
  // The pages Take retained for the caller, per layer, page 0 first.
  struct Taken {
    std::vector<std::vector<PageId>> pages;
    std::vector<std::vector<PageChecksum>> sums;
    std::vector<std::vector<uint64_t>> digests;
    int partition = 0;  // every page's
  };

  // `pool`: the cold pool, which must outlive the index; `events` (may be
  // null) is told of every entry entered and evicted, and must outlive it.
  PrefixIndex(PagePool& pool, int layers, PageEvents* events = nullptr)
      : pool_(pool), layers_(layers), events_(events) {}
  ~PrefixIndex();  // drops every reference it holds
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Enters pages[i] as (ns, keys[i], layer), taking over the caller's one
  // reference to each; a key already held keeps its page (the new
  // reference is dropped) and becomes the most recent. `parent`: the key
  // of the page before keys[0] (PageKeyRoot() for a sequence's page 0).
  void Insert(const PageKey& ns, int layer, const PageKey& parent, absl::Span<const PageKey> keys,
              std::vector<Page> pages) ABSL_LOCKS_EXCLUDED(mu_);
  // A sequence of `ns` went on past the page keyed `parent` with tokens
  // without ids. Not recorded for the root (a sequence without any ids):
  // every prompt's first page has it for parent, so a first page is never
  // said to be unhashed.
  void MarkUnhashed(const PageKey& ns, const PageKey& parent) ABSL_LOCKS_EXCLUDED(mu_);
  // The leading pages of `keys` held under `ns`; changes nothing.
  void Lookup(const PageKey& ns, absl::Span<const PageKey> keys, Match* match) const ABSL_LOCKS_EXCLUDED(mu_);
  // Lookup, then retains for the caller the first min(match->pages,
  // max_pages) pages of every layer, stopping before the first page that
  // lies in another partition than page 0 of layer 0; returns how many
  // (per layer) and makes them the most recent.
  int64_t Take(const PageKey& ns, absl::Span<const PageKey> keys, int64_t max_pages, Taken* taken, Match* match)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts least recent entries whose page only the index holds, in
  // `partition`, until `pages` pages are freed or none is left; returns
  // how many were freed.
  int64_t Evict(int64_t pages, int partition) ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts every entry whose page only the index holds.
  int64_t EvictAll() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t entries() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t evictions() const ABSL_LOCKS_EXCLUDED(mu_);

  // Every entry, least recent first: Insert (with the root for parent) in
  // this order rebuilds the recency (a snapshot's warm restart). The pages
  // are the index's; the caller takes no reference.
  struct Entry {
    PageKey ns, key;
    int layer = 0;
    Page page;
  };
  std::vector<Entry> Entries() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct NodeKey {
    PageKey ns, key;
    bool operator==(const NodeKey& o) const { return ns == o.ns && key == o.key; }
    template <typename H>
    friend H AbslHashValue(H h, const NodeKey& k) {
      return H::combine(std::move(h), k.ns, k.key);
    }
  };
  struct EvictedKey {
    NodeKey node;
    int layer;
    bool operator==(const EvictedKey& o) const { return node == o.node && layer == o.layer; }
    template <typename H>
    friend H AbslHashValue(H h, const EvictedKey& k) {
      return H::combine(std::move(h), k.node, k.layer);
    }
  };
  // One layer's page of a key; linked in the LRU list while it holds one.
  struct Slot {
    PageId page = -1;
    PageChecksum sum = 0;
    std::vector<uint64_t> digests;
    Slot* prev = nullptr;  // more recent
    Slot* next = nullptr;  // less recent
    const NodeKey* key = nullptr;
    int layer = 0;
  };
  struct Node {
    std::vector<Slot> slots;  // one per layer, sized once (stable addresses)
    int held = 0;             // slots holding a page
  };
  using Map = absl::node_hash_map<NodeKey, Node>;

  void LookupLocked(const PageKey& ns, absl::Span<const PageKey> keys, Match* match,
                    std::vector<const Node*>* nodes) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Unlink(Slot* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushFront(Slot* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a slot whose page was freed; erases its node when it was the last.
  void DropSlot(Slot* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t EvictLocked(int64_t pages, int partition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PagePool& pool_;
  const int layers_;
  PageEvents* const events_;
  mutable absl::Mutex mu_;
  Map map_ ABSL_GUARDED_BY(mu_);
  Slot* head_ ABSL_GUARDED_BY(mu_) = nullptr;  // most recent
  Slot* tail_ ABSL_GUARDED_BY(mu_) = nullptr;  // least recent
  int64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<EvictedKey> evicted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<NodeKey> unhashed_ ABSL_GUARDED_BY(mu_);         // (ns, parent key)
  absl::flat_hash_set<NodeKey> parents_ ABSL_GUARDED_BY(mu_);          // (ns, key a page followed)
  absl::flat_hash_map<PageKey, int> namespaces_ ABSL_GUARDED_BY(mu_);  // nodes holding each key
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PREFIX_INDEX_H_
