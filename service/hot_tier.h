// The hot tier (docs/hot_tier.md, "Service"): with a hot budget a layer's
// full pages are all in the cold pool (D-Quant pages) or all in the hot
// pool (level pages), LayerState::hot says which; both give the same
// answers. HotTier moves layers between the two and keeps the hot layers
// in least-recently-attended order; it knows nothing of the table of
// sequences or of requests: callers hand it the sequences and layers.
//
// Rules:
//   - Promotion happens before an Attend takes its batch's locks: at once
//     (sync) or on one background thread (async; a queued layer is queued
//     once however often it is attended before the thread gets to it).
//   - Room is made by demoting the least recently attended layers, never
//     one the caller holds (Held) and never one whose locks are busy:
//     victims are taken only with TryLock and skipped when busy, so
//     demotion can run under the caller's own layer locks (an Append's new
//     page of a hot layer) without a lock-order cycle.
//   - A hot layer's new pages go hot at once (their hot pages reserved
//     before they are encoded, straight into level form); with no hot
//     page to be had, even after demoting others, the layer itself goes
//     cold (an Append is never refused for the hot tier's sake).
//   - Layers not attended for idle_seconds go cold (DemoteIdle).
//   - Devices: with several (PARTITIONS in backends/page_pool.h), the hot
//     pool has one partition per device beside the cold pool's, and a
//     layer moves only within its sequence's device (Sequence::device):
//     its hot pages come from that device's partition, room there is made
//     by demoting that device's layers, and its cold pages go back there.
//   - Pages may be shared by several layers (a forked sequence's, with
//     PagePool reference counts): a move reserves new pages for the layer
//     and frees its old ones, which drops only its own references, so the
//     other holders keep theirs in their tier. A fork's hot layer enters
//     the LRU through AddShared.
//   - Checksums (PageVerifier), each over the bytes the backend holds: a
//     cold page is checked before it is promoted (a corrupt one stays cold
//     and a sync promotion reports DATA_LOSS), the level form's checksum is
//     recorded after (LayerState::hot_sums); a hot page is checked against
//     it before demotion, and the demoted bytes against the cold checksum.
//     A layer that fails either stays where it was.
//   - Cold copies (keep_cold_copies; service/cold_copies.h): a promoted
//     layer's cold pages stay in the cold pool as its copies, charged to
//     no tenant, until the pool falls short (the Handler's reclaimer
//     takes them back before it evicts or spills anything). Demotion
//     checks a kept copy's checksum and takes it back instead of coding
//     the page; a copy that fails is freed and its page coded.
//   - A layer's tenant is charged for its pages at their tier's page size
//     (TenantUsage's max_bytes): a move changes the charge by the
//     difference. Promotion charges it first and leaves the layer cold
//     when the tenant has no room; a hot layer's new page goes cold the
//     same way; demotion never fails for it.
//
// Locks: a layer moves under its LayerState::mu as a writer, with its
// Sequence::mu held as a reader (or writer). hot_mu_ (the LRU) and
// promote_mu_ (the queue) are leaves: nothing is acquired while either is
// held. The global order is in service/handler.h.
#ifndef DRIFTKV_SERVICE_HOT_TIER_H_
#define DRIFTKV_SERVICE_HOT_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/page_pool.h"
#include "service/cold_copies.h"
#include "service/config.h"
#include "service/metrics.h"
#include "service/page_verifier.h"
#include "service/sequence.h"
#include "service/tenant.h"

namespace driftkv {

class HotTier {
 public:
  // What the caller of a demotion holds: layers (LayerState::id) never to
  // demote, and sequences whose mu it holds as a reader (their layers are
  // tried without locking the sequence again).
  struct Held {
    absl::flat_hash_set<uint64_t> layers;
    absl::flat_hash_set<const Sequence*> sequences;
  };

  // Every reference must outlive the tier. `cold`: the D-Quant page pool;
  // `hot`: the level-page pool; `backend` moves pages between them;
  // `after_move` (may be empty) runs after the background thread moved a
  // layer (the owner republishes its gauges). kAsync starts the thread.
  // `keep_cold_copies`: a promoted layer's cold pages are kept as copies
  // (service/cold_copies.h) until the cold pool needs them.
  HotTier(PagePool& cold, PagePool& hot, Backend& backend, const PageVerifier& verifier, Metrics* metrics,
          ServiceClock clock, HotPromotion promotion, double idle_seconds, std::function<void()> after_move,
          bool keep_cold_copies = false);
  ~HotTier();  // stops the promotion thread
  // Stops the promotion thread (queued layers stay cold); idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(promote_mu_);

  // Before an Attend takes its locks: promotes (sync) or queues (async)
  // the cold ones of `layers` (each once); none is demoted to make room
  // for another (`ids`: their LayerState::id). No lock held. Sync: DATA_LOSS
  // when a layer's cold page fails its checksum (*failed: its index in
  // `layers`), and the layers after it are not promoted.
  absl::Status Prepare(const std::vector<std::pair<SequencePtr, int>>& layers, const absl::flat_hash_set<uint64_t>& ids,
                       size_t* failed = nullptr);
  // Sync Prepare's first try: the cold layers of `layers` promoted in one
  // PromotePagesChecked under all their locks. False, nothing promoted,
  // when there are fewer than two or they do not fit together (no room, a
  // page that does not decode): the caller promotes them one by one. True:
  // each promoted, or left cold for its tenant's bytes; from the first (in
  // `layers` order) whose cold page fails its checksum on, none promoted,
  // *corrupt its DATA_LOSS and *failed its index. No lock held. (This,
  // DemoteVictim and DemoteIdle lock sets of run-time size, conditionally
  // or in loops, which the thread-safety analysis cannot follow.)
  bool PromoteTogether(const std::vector<std::pair<SequencePtr, int>>& layers, const absl::flat_hash_set<uint64_t>& ids,
                       absl::Status* corrupt, size_t* failed) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // A promotion's switch: the layer's cold pages freed (or kept as its
  // copies), `hot` and their
  // checksums in their place, the layer in the LRU, the counts. The
  // tenant's charge is the caller's. REQUIRES: the layer's mu as a writer
  // and its sequence's.
  void CommitPromotion(const SequencePtr& seq, int layer_index, std::vector<PageId> hot, HotSums hot_sums);
  // Promotes one layer, making room by demoting layers not in `exclude`.
  // No lock held. False when it stays cold: no room, a page that does not
  // decode, or one failing its checksum (then *corrupt, if given, is the
  // DATA_LOSS naming it).
  bool PromoteLayer(const SequencePtr& seq, int layer_index, const absl::flat_hash_set<uint64_t>& exclude,
                    absl::Status* corrupt = nullptr);
  // `count` hot pages of device `device`, demoting least recently attended
  // layers of that device until they fit; RESOURCE_EXHAUSTED when nothing
  // more can be demoted.
  absl::StatusOr<std::vector<PageId>> ReserveHot(int64_t count, const Held& held, int device);
  // Demotes the least recently attended layer of `device` that is not held
  // and whose locks are free; false when there is none. `tried` collects
  // the layers looked at (each is looked at once per caller).
  bool DemoteVictim(const Held& held, int device, absl::flat_hash_set<uint64_t>* tried) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Moves a hot layer's pages to the cold pool; `usage`: the layer's
  // tenant's, `name`: the layer in messages. Pages with a kept cold copy
  // whose bytes still match their checksum go back to it; the others are
  // coded by the backend. DATA_LOSS, the layer staying hot, when a hot
  // page or its demoted form fails its checksum.
  // REQUIRES: layer->mu held as a writer and its sequence's mu; layer->hot.
  absl::Status DemoteLocked(LayerState* layer, TenantUsage* usage, const LayerName& name, DemotionReason reason);
  // Several layers' demotions (DemoteLocked each, with the copies that
  // TakeCopies took) with one hot checksum pass, one backend move and one
  // cold checksum pass for them all: a job that fails leaves its layer hot
  // with its copies kept (`status` says why) and the others go on.
  // REQUIRES: each layer's mu held as a writer and its sequence's; each
  // layer hot.
  struct DemoteJob {
    LayerState* layer = nullptr;
    TenantUsage* usage = nullptr;
    LayerName name;
    std::vector<PageId> kept;  // its copies, taken and checked
    absl::Status status;       // out
  };
  void DemoteTogetherLocked(absl::Span<DemoteJob> jobs, DemotionReason reason);
  // For new pages encoded cold first (prefix-keyed, or from device
  // staging; the others are encoded straight into the hot pages of
  // ReserveNewPages below): where the new cold pages `cold` of the hot
  // `layer` go (their tenant,
  // `usage`, is charged for them as cold pages): on OK either *hot holds
  // their hot pages and *hot_sums their level form's checksums (the caller
  // frees `cold`) or, with no hot page to be had or no room in the
  // tenant's max_bytes, both are empty and the layer was demoted.
  // REQUIRES: layer->mu held as a writer, layer->hot; `cold` checksummed
  // from the backend's copy under that lock.
  absl::Status PlaceNewPages(LayerState* layer, TenantUsage* usage, const LayerName& name,
                             const std::vector<PageId>& cold, const Held& held, std::vector<PageId>* hot,
                             std::vector<PageChecksum>* hot_sums);
  // PlaceNewPages for several hot layers of one tenant (`usage`) at once:
  // one charge, one reservation, one promotion, one checksum pass. True
  // when every layer's pages went hot (batch[k].hot, batch[k].hot_sums);
  // false, nothing placed, when they cannot all go together (no room, a
  // failed promotion): the caller then places them one by one.
  // REQUIRES: as PlaceNewPages, for each layer.
  struct NewPages {
    LayerState* layer = nullptr;
    const std::vector<PageId>* cold = nullptr;
    std::vector<PageId>* hot = nullptr;
    std::vector<PageChecksum>* hot_sums = nullptr;
  };
  bool PlaceNewPagesTogether(TenantUsage* usage, absl::Span<const NewPages> batch, const Held& held);

  // Hot pages reserved for a hot layer's new pages before they are encoded
  // straight into level form (Backend::EncodeLevelPages), with the
  // tenant's charge for them at the hot page size. Given back when
  // destroyed, unless kept (the pages committed to the layer).
  class NewPagesReservation {
   public:
    NewPagesReservation() = default;
    NewPagesReservation(NewPagesReservation&& o) noexcept { *this = std::move(o); }
    NewPagesReservation& operator=(NewPagesReservation&& o) noexcept;
    ~NewPagesReservation() { Release(); }
    const std::vector<PageId>& pages() const { return pages_; }
    bool empty() const { return pages_.empty(); }
    // The pages belong to the layer now, and the charge stays.
    void Keep();

   private:
    friend class HotTier;
    void Release();
    PagePool* pool_ = nullptr;  // null: nothing held
    std::vector<PageId> pages_;
    ByteCharge charge_;
  };
  // A hot layer (its mu held as a writer) wanting `count` hot pages for new
  // pages on `device`; `usage` its tenant's, `name` for messages.
  struct NewPagesWanted {
    LayerState* layer = nullptr;
    TenantUsage* usage = nullptr;
    const LayerName* name = nullptr;
    int64_t count = 0;
    int device = 0;
    NewPagesReservation* reservation = nullptr;  // out
  };
  // Reserves each layer's hot pages, demoting others (never a held one) for
  // room: in one reservation when all are one tenant's on one device and
  // fit, else one by one. A layer that gets none (no hot page to be had,
  // or no room in its tenant's max_bytes) is demoted itself, as
  // PlaceNewPages does, and keeps an empty reservation: its new pages go
  // cold. A demotion's DATA_LOSS is returned (*failed: that layer's index
  // in `wanted`); the reservations of that layer and those after it are
  // then empty.
  absl::Status ReserveNewPages(absl::Span<const NewPagesWanted> wanted, const Held& held, size_t* failed);
  // Counts `pages` new pages committed straight into level form.
  void CountEncodedHot(int64_t pages);
  uint64_t pages_encoded_hot() const { return pages_encoded_hot_.load(); }
  // Demotes layers not attended for idle_seconds (none when it is 0);
  // true when any was a candidate.
  bool DemoteIdle() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Enters a layer that became hot without a promotion, by sharing the
  // level pages of another hot layer (Handler::Fork), in the LRU as
  // attended now: from here it is demoted like any hot layer. REQUIRES:
  // the layer's mu held (either mode) and its sequence's mu as a reader;
  // the layer hot, its sequence in the table.
  void AddShared(const SequencePtr& seq, int layer_index) ABSL_LOCKS_EXCLUDED(hot_mu_);
  // Gives a hot layer's pages back to the hot pool, frees its cold copies
  // and forgets the layer (the caller clears layer->pages). REQUIRES: the layer's sequence's mu
  // held as a writer; layer->hot.
  void FreeLayer(LayerState* layer) ABSL_LOCKS_EXCLUDED(hot_mu_);
  // Marks hot layer `id` attended at `now_ns` (Now()).
  void Touch(uint64_t id, int64_t now_ns) ABSL_LOCKS_EXCLUDED(hot_mu_);
  // The same for several layers (an Attend's), under one lock.
  void Touch(absl::Span<const uint64_t> ids, int64_t now_ns) ABSL_LOCKS_EXCLUDED(hot_mu_);
  int64_t NowNs() const { return absl::ToUnixNanos(clock_()); }
  // Waits until every queued promotion has run; at once without a thread.
  void DrainPromotions() ABSL_LOCKS_EXCLUDED(promote_mu_);

  // Hot layers from least to most recently attended (tests, tools).
  std::vector<uint64_t> LruOrder() const ABSL_LOCKS_EXCLUDED(hot_mu_);
  size_t layers() const ABSL_LOCKS_EXCLUDED(hot_mu_);
  uint64_t promotions() const { return promotions_.load(); }
  uint64_t demotions() const { return demotions_.load(); }
  uint64_t pages_promoted() const { return pages_promoted_.load(); }
  uint64_t pages_demoted() const { return pages_demoted_.load(); }
  uint64_t pages_demoted_from_copies() const { return pages_demoted_from_copies_.load(); }
  const PagePool& pool() const { return hot_; }
  // Cold copies (service/cold_copies.h): pages held only as copies, in
  // all and on one partition of the cold pool (0 when copies are off).
  int64_t cold_copy_pages() const { return copies_ != nullptr ? copies_->pages() : 0; }
  int64_t cold_copy_pages(int partition) const { return copies_ != nullptr ? copies_->pages(partition) : 0; }
  // After a hot layer's new pages were placed from their cold form
  // (PlaceNewPages, PlaceNewPagesTogether): those cold pages, which were
  // page indices [first, first + cold.size()) of the layer, become its
  // copies when its copies cover every page before them; else they are
  // freed. REQUIRES: the layer's mu held as a writer.
  void KeepPlacedCopies(const LayerState& layer, size_t first, std::vector<PageId> cold);
  // The cold pool's reclaimer calls this first: copies of `partition`
  // freed until `pages` went back to the free list; returns how many did.
  int64_t ReclaimCopies(int64_t pages, int partition);
  // Sets the tier's gauges (hot pages in use, hot layers).
  void PublishGauges() const ABSL_LOCKS_EXCLUDED(hot_mu_);

 private:
  void PromotionThread();
  void AddHot(const SequencePtr& seq, int layer_index, uint64_t id) ABSL_LOCKS_EXCLUDED(hot_mu_);
  // The change in a tenant's bytes when `count` pages move to the hot
  // pool (`to_hot`) or back.
  HeldBytes MoveBytes(int64_t count, bool to_hot) const;
  void RemoveHot(uint64_t id) ABSL_LOCKS_EXCLUDED(hot_mu_);
  // ReserveNewPages for one layer.
  absl::Status ReserveNewPagesFor(const NewPagesWanted& w, const Held& held);
  // Backend::PromotePagesChecked of `moves` between the two pools, its
  // time observed in driftkv_tier_promotion_backend_seconds; with `later`,
  // PromotePagesCheckedLater (the level sums may come later).
  absl::Status PromoteOnBackend(absl::Span<const TierMove> moves, PageChecksum* cold_sums, PageChecksum* hot_sums,
                                std::shared_ptr<PendingChecksums>* later = nullptr);
  // Each layer's kept cold copies, when their bytes as the backend holds
  // them match the layer's cold checksums; else none (those freed). All
  // layers' copies are summed in one backend call (one launch on cuda).
  // REQUIRES: each layer's mu held as a writer; each layer hot.
  std::vector<std::vector<PageId>> TakeCopies(absl::Span<LayerState* const> layers, absl::Span<const LayerName> names);
  // Sets driftkv_tier_cold_copies_pages from the copies held now.
  void PublishCopies() const;

  PagePool& cold_;
  PagePool& hot_;
  Backend& backend_;
  const PageVerifier& verifier_;
  Metrics* const metrics_;
  const ServiceClock clock_;
  const HotPromotion promotion_;
  const double idle_seconds_;
  const std::function<void()> after_move_;
  const std::unique_ptr<ColdCopies> copies_;  // null: copies off

  // The hot layers; their least-recently-attended order is sorted only
  // when a demotion asks for it (LruLocked), so that an Attend's touch of
  // its layers is one hash lookup each.
  struct Entry {
    SequencePtr seq;
    int layer = 0;
    int64_t attended_ns = 0;  // clock of the last Attend (or the promotion)
  };
  mutable absl::Mutex hot_mu_;
  absl::flat_hash_map<uint64_t, Entry> hot_layers_ ABSL_GUARDED_BY(hot_mu_);  // by LayerState::id
  // (attended_ns, id) of every hot layer, oldest first.
  std::vector<std::pair<int64_t, uint64_t>> LruLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(hot_mu_);
  std::atomic<uint64_t> promotions_{0};
  std::atomic<uint64_t> demotions_{0};
  std::atomic<uint64_t> pages_promoted_{0};
  std::atomic<uint64_t> pages_demoted_{0};
  std::atomic<uint64_t> pages_demoted_from_copies_{0};  // also counted in pages_demoted_
  std::atomic<uint64_t> pages_encoded_hot_{0};          // also counted in pages_promoted_
  // Async promotion: a queue of layers, one thread.
  absl::Mutex promote_mu_;
  std::deque<std::pair<SequencePtr, int>> promote_queue_ ABSL_GUARDED_BY(promote_mu_);
  bool promote_stop_ ABSL_GUARDED_BY(promote_mu_) = false;
  int promote_running_ ABSL_GUARDED_BY(promote_mu_) = 0;
  std::thread promoter_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_HOT_TIER_H_
