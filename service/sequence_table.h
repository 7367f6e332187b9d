// The table of stored sequences (service/sequence.h): lookup, creation,
// release and expiry, the device slot of each sequence, the tenants'
// ledger and the tombstones of released ids. It decides which sequences
// exist; what is in their layers is the Handler's business (append,
// attend) and the hot tier's (service/hot_tier.h).
//
// TENANTS (service/tenant.h). The table is keyed by TenantKey(tenant,
// sequence_id), so a tenant sees only its own sequences. Each sequence
// points at its tenant's TenantUsage (the ledger owns it), charged for
// itself here, and for its pages and their bytes and its windows' bytes
// by whoever reserves the pages or grows the windows; the table refunds
// what a released or expired sequence held (BytesOf).
//
// TOMBSTONES (service/tombstones.h). Release tombstones a key before it
// leaves the table, both under mu_, and FindOrCreate checks tombstones
// under mu_, so no Append can slip in between. Expiry leaves none.
//
// DRAIN. After BeginDrain no sequence is created (UNAVAILABLE); existing
// ones are served.
//
// Locks: mu_ guards the table and the per-device counts. It is taken
// before any Sequence::mu (DropIfEmpty holds both) and never while one is
// held. Release and expiry take each removed sequence's mu as a writer
// after mu_ is released; the ledger's and the tombstones' locks are leaves.
#ifndef DRIFTKV_SERVICE_SEQUENCE_TABLE_H_
#define DRIFTKV_SERVICE_SEQUENCE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "backends/page_pool.h"
#include "prometheus/gauge.h"
#include "service/config.h"
#include "service/hot_tier.h"
#include "service/metrics.h"
#include "service/sequence.h"
#include "service/tenant.h"
#include "service/tombstones.h"

namespace driftkv {

class SequenceTable {
 public:
  // Every reference must outlive the table. `n`: values per token
  // (kv_heads * head_dim), to count window tokens; `pool`: the cold pool
  // (its partitions are the device slots); `hot`: null without a hot
  // tier; `device_ids`: the device index of each partition (label of the
  // per-device gauges).
  SequenceTable(const ServiceOptions& options, int n, PagePool& pool, HotTier* hot, Metrics* metrics,
                ServiceClock clock, std::vector<int> device_ids);

  // By table key (TenantKey).
  SequencePtr Find(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // The sequences `ids` of `tenant`, in order (null: none), under one
  // acquisition of the table's lock.
  void FindAll(absl::string_view tenant, absl::Span<const absl::string_view> ids, std::vector<SequencePtr>* out) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Finds or creates; *created tells which. UNAVAILABLE while draining,
  // FAILED_PRECONDITION for a tombstoned key unless `new_incarnation`,
  // RESOURCE_EXHAUSTED at max_sequences or the tenant's max_sequences;
  // messages name `id` (the request's sequence_id). A new sequence goes to
  // the least loaded device slot.
  absl::StatusOr<SequencePtr> FindOrCreate(const std::string& key, const std::string& id, const std::string& tenant,
                                           bool new_incarnation, bool* created) ABSL_LOCKS_EXCLUDED(mu_);
  // FORK (Handler::Fork builds a sequence where no one else sees it, then
  // enters it). CheckNew: what creating `key` would answer now, changing
  // nothing: ALREADY_EXISTS when it exists, else FindOrCreate's errors.
  // Insert: enters `seq` (its id is the key) under the same rules, checked
  // again under the table's lock, charging `seq`'s tenant for one sequence
  // (its pages and bytes are the caller's to charge and refund) and its
  // device slot; with `new_incarnation` the key's tombstone goes.
  absl::Status CheckNew(const std::string& key, const std::string& id, TenantUsage* usage, bool new_incarnation) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Insert(const SequencePtr& seq, const std::string& id, bool new_incarnation) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops a sequence the caller created if it is still empty.
  void DropIfEmpty(const SequencePtr& seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Tombstones `key`, removes it and frees its pages and windows (waits
  // for operations in flight on it); NOT_FOUND naming `id` when absent.
  absl::Status Release(const std::string& key, const std::string& id, uint64_t* tokens, uint64_t* pages)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases sequences idle for longer than ttl_seconds (none if it is 0),
  // without tombstones; returns how many.
  int ExpireIdle() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks an access (for the TTL).
  void Touch(Sequence* seq) const { seq->last_access_ns.store(NowNs()); }
  // The clock of last_access_ns (for touching many sequences at once).
  int64_t NowNs() const { return absl::ToUnixNanos(clock_()); }

  // FAILED_PRECONDITION (counted as an integrity rejection) while `key`
  // is tombstoned.
  absl::Status CheckTombstone(const std::string& key, const std::string& id) const;
  void EraseTombstone(const std::string& key) { tombstones_.Erase(key); }
  // The live tombstones with their time left (a snapshot's), and one put
  // back (a restore's).
  std::vector<std::pair<std::string, absl::Duration>> TombstoneEntries() const { return tombstones_.Entries(clock_()); }
  void RestoreTombstone(const std::string& key, absl::Duration left) { tombstones_.Restore(key, clock_(), left); }
  // Drops expired tombstones; returns how many are left.
  size_t PurgeTombstones() { return tombstones_.Purge(clock_()); }
  // Live tombstones of `tenant`'s ids (without tokens, "": all of them).
  size_t TenantTombstones(absl::string_view tenant) const {
    return tombstones_.CountWithPrefix(TenantKey(tenant, ""), clock_());
  }

  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // Tokens stored in pages and in windows, over all sequences: whoever
  // changes a layer's pages or window reports it here.
  void CountTokens(int64_t compressed, int64_t window) {
    tokens_compressed_ += compressed;
    tokens_window_ += window;
  }
  int64_t tokens_compressed() const { return tokens_compressed_.load(); }
  int64_t tokens_window() const { return tokens_window_.load(); }
  uint64_t sequences_expired() const { return sequences_expired_.load(); }
  uint64_t sequences_released() const { return sequences_released_.load(); }

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::vector<int>& device_ids() const { return device_ids_; }
  int64_t device_sequences(int slot) const ABSL_LOCKS_EXCLUDED(mu_);
  TenantUsage* Usage(const std::string& tenant) { return ledger_.Get(tenant); }
  // Null when the tenant holds nothing and never did.
  const TenantUsage* FindTenant(const std::string& tenant) const { return ledger_.Find(tenant); }
  // Every entry (key, sequence), unordered.
  std::vector<std::pair<std::string, SequencePtr>> Entries() const ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes a layer holds: its pages at their tier's page size, its window
  // tokens at WindowBytesPerToken. REQUIRES: the layer's mu (or its
  // sequence's as a writer), or a sequence no one else sees yet.
  HeldBytes BytesOf(const LayerState& layer) const;
  HeldBytes BytesOf(const Sequence& seq) const;

  // RESTORE (a snapshot loader builds sequences itself): the device slot
  // for a new sequence; Adopt enters `seq`, charging its tenant for it,
  // its `pages` and the bytes of its pages and windows (RESOURCE_EXHAUSTED
  // / ALREADY_EXISTS / the quota's error, nothing changed); Unadopt undoes
  // an Adopt.
  int PlaceNew() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Adopt(const SequencePtr& seq, int64_t pages) ABSL_LOCKS_EXCLUDED(mu_);
  void Unadopt(const SequencePtr& seq, int64_t pages) ABSL_LOCKS_EXCLUDED(mu_);

  // THE DISK LEVEL (service/spill_tier.h), set once before serving (both
  // may be empty): `entered` is told of every sequence entered into the
  // table, under mu_ (it takes only leaf locks); `free_below` frees what a
  // sequence being released or expired holds on a level below, called
  // with its mu held as a writer, instead of freeing its pages to the pool.
  struct SpillHooks {
    std::function<void(const SequencePtr&)> entered;
    std::function<void(Sequence&)> free_below;
  };
  void SetSpillHooks(SpillHooks hooks) { spill_ = std::move(hooks); }

  // Sets the gauges of the tokens, the sequences, each device and (with
  // tokens) each tenant.
  void PublishGauges() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Map = absl::flat_hash_map<std::string, SequencePtr>;
  // The device slot for a new sequence: fewest pages in use (cold and
  // hot), then fewest sequences.
  int LeastLoadedDevice() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks of a new sequence under the absent `key`, in FindOrCreate's
  // order (drain, tombstone unless `new_incarnation`, max_sequences, the
  // tenant's max_sequences); with `charge` the tenant's sequence count is
  // charged when they pass.
  absl::Status AdmitLocked(const std::string& key, const std::string& id, TenantUsage* usage, bool new_incarnation,
                           bool charge) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a sequence from the table, refunding its tenant's sequence
  // count and its device slot's.
  void EraseLocked(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a sequence's pages (either tier) and windows. REQUIRES: not
  // released.
  void FreeLocked(Sequence* seq, uint64_t* tokens, uint64_t* pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq->mu);

  const ServiceOptions& options_;
  const int n_;
  PagePool& pool_;
  HotTier* const hot_;
  Metrics* const metrics_;
  const ServiceClock clock_;
  const std::vector<int> device_ids_;
  std::vector<prometheus::Gauge*> device_used_gauges_, device_sequence_gauges_;
  std::vector<prometheus::Gauge*> device_hot_used_gauges_;  // empty without a hot tier
  TenantLedger ledger_;
  mutable Tombstones tombstones_;  // internally locked

  mutable absl::Mutex mu_;
  Map table_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> device_sequences_ ABSL_GUARDED_BY(mu_);  // sequences per partition

  std::atomic<bool> draining_{false};
  std::atomic<int64_t> tokens_compressed_{0};
  std::atomic<int64_t> tokens_window_{0};
  std::atomic<uint64_t> sequences_expired_{0};
  std::atomic<uint64_t> sequences_released_{0};
  SpillHooks spill_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SEQUENCE_TABLE_H_
