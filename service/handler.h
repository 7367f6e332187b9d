// The service's logic, without a network: validates each request, decides,
// and changes the pool; returns absl::Status (grpc_service.h converts it at
// the edge). Tested directly by tests/service_handler_test.cc.
//
// State: a table of sequences; each sequence holds, per layer, the ids of
// its full pages (oldest first) and a bf16 window of the newest tokens.
// Invariants of a layer with `length` tokens:
//   length = pages.size() * P + window tokens,
//   window tokens in [0, R + P), and >= R once any page exists;
//   page i holds tokens [i P, (i + 1) P) = one key-mean window.
// When an append makes the window hold >= R + P tokens, its oldest P tokens
// are encoded into a new page, as often as needed. Encoding reads the bf16
// values, so a token's stored form does not depend on how it was chunked.
//
// Rejected requests change nothing: every check runs and every page is
// reserved (all-or-nothing) before the first mutation.
//
// TENANTS (service/tenant.h). Every call acts for a tenant ("" without
// tokens); the table is keyed by TenantKey(tenant, sequence_id), so a
// tenant sees only its own sequences. Each sequence points at its tenant's
// TenantUsage, charged for its pages and for itself (quotas).
//
// INTEGRITY. A repeated Append of stored tokens is compared with what is
// stored before it is acknowledged (handler_repeat.cc): window tokens bit
// for bit as bf16, paged tokens by their TokenDigest kept at encoding; a
// mismatch is ALREADY_EXISTS naming the token range. A released id is
// tombstoned (service/tombstones.h) for tombstone_seconds.
//
// Locking, outermost first:
//   table_mu_          the table of sequences;
//   Sequence::mu       readers: any operation on the sequence's layers;
//                      writer: Release, expiry, dropping a failed new sequence
//                      (which therefore wait for operations in flight);
//   LayerState::mu     readers: Attend (without steps) and Read of the layer;
//                      writer: Append and decode steps on the layer.
// Several sequences are locked in ascending id order, all Sequence::mu
// before any LayerState::mu, and layers in ascending (id, layer) order. So
// the layers of one sequence ingest in parallel, many Attend calls on one
// layer run at once, and nothing is torn: a holder of a stale pointer sees
// the `released` mark and answers NOT_FOUND.
//
// HOT TIER (handler_tier.cc; docs/hot_tier.md, "Service"). With a hot
// budget a layer's full pages are all in the cold pool (D-Quant pages) or
// all in the hot pool (level pages), LayerState::hot says which; both give
// the same answers. Moving a layer takes its LayerState::mu as a writer,
// never while another layer's lock is held in the blocking way: Attend
// promotes its cold layers in a step before it takes the batch's locks
// (sync; async hands them to a background thread), and a layer that must
// be demoted to make room (least recently attended first, never one of the
// caller's) is taken only with TryLock and skipped when busy, so demotion
// can run under the caller's locks (an Append's new page of a hot layer)
// without a lock-order cycle. hot_mu_ (the LRU order) and promote_mu_ are
// leaves: nothing is acquired while either is held.
#ifndef DRIFTKV_SERVICE_HANDLER_H_
#define DRIFTKV_SERVICE_HANDLER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "backends/page_checksum.h"
#include "backends/page_pool.h"
#include "codec/kv_codec.h"
#include "proto/driftkv.pb.h"
#include "service/config.h"
#include "service/metrics.h"
#include "service/tenant.h"
#include "service/tombstones.h"

namespace driftkv {

constexpr const char* kServerVersion = "0.1.0";

class Handler {
 public:
  using Clock = std::function<absl::Time()>;

  // Builds the codec, the pool arena and the backend. `metrics` must outlive
  // the handler; `clock` (for TTLs) defaults to absl::Now.
  static absl::StatusOr<std::unique_ptr<Handler>> Create(const ServiceOptions& options,
                                                         Metrics* metrics, Clock clock = nullptr);
  ~Handler();  // stops the promotion thread (async hot tier) first

  // Every call acts for `tenant` (TENANTS; "" without tokens).
  // One chunk of an Append stream; adds to `totals` when accepted.
  absl::Status Append(const v1::AppendChunk& chunk, v1::AppendResponse* totals,
                      const std::string& tenant = "");
  // DEVICE INGEST (backends/backend.h, docs/nccl.md): a chunk whose keys and
  // values a transport received into staging memory of the backend
  // (backend().AllocateStaging). Exactly Append's semantics and messages:
  // all-or-nothing, tokens already stored acknowledged (after comparing
  // them with what is stored), gaps OUT_OF_RANGE, tenants and tombstones.
  // CheckChunkHeader runs the checks that need no tensor data (the
  // transport uses it before receiving); AppendStaged runs them again.
  absl::Status CheckChunkHeader(const v1::PushChunkRequest& header) const;
  absl::Status AppendStaged(const v1::PushChunkRequest& header, const StagedTokens& tokens,
                            v1::AppendResponse* totals, const std::string& tenant = "");
  Backend& backend() { return *backend_; }
  absl::Status Attend(const v1::AttendRequest& request, v1::AttendResponse* response,
                      const std::string& tenant = "");
  // Streams the answer through `sink`, which returns false to stop (the
  // client went away: Cancelled).
  absl::Status Read(const v1::ReadRequest& request,
                    const std::function<bool(const v1::ReadChunk&)>& sink, const std::string& tenant = "");
  // Frees the sequence and tombstones its id (tombstone_seconds).
  absl::Status Release(const v1::ReleaseRequest& request, v1::ReleaseResponse* response,
                       const std::string& tenant = "");
  // Token counts of every layer (handler_length.cc); NOT_FOUND for an
  // unknown sequence. Not an access for the TTL.
  absl::Status Length(const v1::LengthRequest& request, v1::LengthResponse* response,
                      const std::string& tenant = "");
  void Info(v1::InfoResponse* response) const;
  void Stats(v1::StatsResponse* response, const std::string& tenant = "") const;

  // Releases sequences idle for longer than the TTL (none if it is 0);
  // returns how many. Also demotes hot layers not attended for
  // hot_idle_seconds (not counted). The server calls it periodically.
  int ExpireIdle();

  // GRACEFUL DRAIN AND WARM RESTART (handler_snapshot.cc;
  // docs/reliability.md). BeginDrain: from now on a chunk that would create
  // a sequence is refused with UNAVAILABLE naming the drain; existing
  // sequences are served as before.
  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  struct SnapshotSummary {
    uint64_t sequences = 0;          // written / restored
    uint64_t pages = 0;
    uint64_t corrupt_pages = 0;      // checksum mismatches (pages and windows)
    uint64_t dropped_sequences = 0;  // not written / not restored, each logged
    bool rest_lost = false;          // load: a corrupt framing field ended the reading early
    std::string path;
  };
  // Writes every sequence to `dir` (service/snapshot_file.h), hot layers in
  // their cold form (demoted first; a layer that cannot be demoted or whose
  // page fails its checksum drops its sequence, counted and logged). Call
  // after the RPCs have stopped; takes every lock meanwhile.
  absl::Status WriteSnapshot(const std::string& dir, SnapshotSummary* summary);
  // Restores the snapshot in `dir`, verifying every page; call once, on an
  // empty handler, before serving. NotFound when there is none. Refuses
  // (FailedPrecondition, naming the field) a snapshot of another
  // codec/shape (SnapshotIdentity). A sequence with a corrupt page or
  // window, or that no longer fits the pool or max_sequences, is dropped:
  // logged by id and layer, counted in *summary, Stats and the metrics;
  // the others are served. The loaded file is renamed to
  // snapshot.dkvs.loaded so that a later crash does not resurrect it.
  absl::Status LoadSnapshot(const std::string& dir, SnapshotSummary* summary);
  // What a snapshot's pages depend on: codec, shape, page format and size,
  // window, transform (with the transforms file's checksum); "key=value"
  // lines.
  std::string SnapshotIdentity() const;

  // Async hot tier: waits until every queued promotion has run (tests and
  // benchmarks); returns at once otherwise.
  void DrainPromotions();
  // Whether the layer's pages are in the hot tier (false for an unknown
  // sequence); for tests and tools.
  bool LayerIsHot(const std::string& sequence_id, uint32_t layer);

  const ServiceOptions& options() const { return options_; }
  // The codec (config codec.name) behind its interface; pages have its
  // page format (config codec.page_format).
  const KvCodec& codec() const { return *codec_; }
  const PagePool& pool() const { return *pool_; }
  // The hot tier's pool of level pages, or null without one.
  const PagePool* hot_pool() const { return hot_pool_.get(); }

 private:
  // One model layer of one sequence: its pages and bf16 window. Fields
  // guarded by mu, or by the sequence's writer lock.
  struct LayerState {
    // Unique for the process's life (AttendJob::window_id).
    const uint64_t id = NewLayerId();
    absl::Mutex mu;
    std::vector<PageId> pages;
    // CRC-32C of each page's cold form (backends/page_checksum.h), parallel
    // to `pages` in either tier: tier moves keep the bytes' cold form.
    std::vector<PageChecksum> page_sums;
    std::vector<uint16_t> window_keys;    // bf16 [window tokens][n]
    std::vector<uint16_t> window_values;
    // TokenDigest of every paged token (pages.size() * P entries, token
    // order), for comparing repeated Appends (INTEGRITY).
    std::vector<uint64_t> digests;
    int64_t length = 0;
    // `pages` are level pages of hot_pool_ (see HOT TIER); a cold layer
    // with no pages is hot once attended, so its first page goes hot.
    bool hot = false;
    // Async hot tier: a promotion of this layer is queued (coalesces).
    std::atomic<bool> promotion_queued{false};
  };
  struct Sequence {
    Sequence(std::string key, int layers, TenantUsage* usage, int device)
        : id(std::move(key)), usage(usage), device(device), layers(layers) {}
    const std::string id;      // the table key: TenantKey(tenant, sequence_id)
    TenantUsage* const usage;  // its tenant's (ledger_ owns it)
    // The pool partition (device slot, options.devices[device]) that holds
    // every page of the sequence: chosen at creation, least loaded, and
    // kept (PARTITIONS in backends/page_pool.h).
    const int device;
    absl::Mutex mu;
    std::vector<LayerState> layers;  // fixed size; see LayerState
    bool released ABSL_GUARDED_BY(mu) = false;
    std::atomic<int64_t> last_access_ns{0};
  };
  using SequencePtr = std::shared_ptr<Sequence>;
  static uint64_t NewLayerId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  // How one append of `count` tokens starting at `first` lands on a layer.
  struct AppendPlan {
    int64_t skip = 0;   // leading tokens already stored
    int64_t fresh = 0;  // tokens to store
    int64_t pages = 0;  // pages to encode
  };

  Handler(const ServiceOptions& options, std::unique_ptr<KvCodec> codec, Metrics* metrics, Clock clock)
      : options_(options),
        codec_(std::move(codec)),
        metrics_(metrics),
        clock_(std::move(clock)),
        ledger_([this](const std::string& tenant) { return options_.QuotaOf(tenant); }),
        tombstones_(absl::Seconds(options.tombstone_seconds)) {}

  // Largest |x| accepted in keys and values: after the transform stage and
  // the mean subtraction a value can grow by 2 G, and the record's fp16 grid
  // must still hold it. G = TransformGain: the largest absolute row sum of
  // the stage's matrices (|(T x)_i| <= sum_j |T_ij| max|x|): sqrt(head_dim)
  // for Hadamard, 1 for identity, the maximum over every T_K and T_V (T_K
  // only with folded values) of the transforms file for wush. Without it a
  // token accepted into the bf16 window could fail to encode later and
  // block its layer.
  float value_limit() const;
  static double TransformGain(const ServiceOptions& options);
  int n() const { return codec_->n(); }
  absl::Status CheckLayer(absl::string_view field, uint32_t layer) const;
  absl::Status CheckSequenceId(absl::string_view field, const std::string& id) const;

  // By table key (TenantKey).
  SequencePtr Find(const std::string& key) ABSL_LOCKS_EXCLUDED(table_mu_);
  // Finds or creates; *created tells which. RESOURCE_EXHAUSTED at
  // max_sequences or the tenant's max_sequences, FAILED_PRECONDITION for a
  // tombstoned key unless `new_incarnation` (named by `id`, the request's
  // sequence_id). Release tombstones a key before it leaves the table,
  // both under table_mu_, so no Append can slip in between.
  absl::StatusOr<SequencePtr> FindOrCreate(const std::string& key, const std::string& id, TenantUsage* usage,
                                           bool new_incarnation, bool* created) ABSL_LOCKS_EXCLUDED(table_mu_);
  // Drops a sequence this call created if it is still empty.
  void DropIfEmpty(const SequencePtr& seq) ABSL_LOCKS_EXCLUDED(table_mu_);
  // Frees a sequence's pages and windows. REQUIRES: seq->mu held, not released.
  void FreeLocked(Sequence* seq, uint64_t* tokens, uint64_t* pages);

  // Where `count` tokens at `first` land; OUT_OF_RANGE on a gap.
  // `length` and `window` are the layer's token counts (or, in a batch, what
  // they will be after the earlier items of the batch).
  absl::StatusOr<AppendPlan> PlanAppend(int64_t length, int64_t window, absl::string_view where,
                                        const std::string& id, uint32_t layer, uint64_t first,
                                        int64_t count) const;
  // What the caller of a demotion holds (HOT TIER): layers (LayerState::id)
  // never to demote, and sequences whose mu it holds as a reader (their
  // layers are tried without locking the sequence again).
  struct TierHeld {
    absl::flat_hash_set<uint64_t> layers;
    absl::flat_hash_set<const Sequence*> sequences;
  };

  // The `count` tokens at `first` that PlanAppend found already stored
  // (plan.skip) equal the stored ones: window tokens as bf16, paged tokens
  // by digest; ALREADY_EXISTS naming the differing token range otherwise
  // (handler_repeat.cc). REQUIRES: layer.mu held.
  absl::Status CheckRepeat(const LayerState& layer, uint64_t first, int64_t count, const float* keys,
                           const float* values, absl::string_view where, const std::string& id,
                           uint32_t layer_index) const;
  // CheckRepeat for a chunk of Append or AppendStaged: the repeated tokens
  // are its first `count` ones, on the host (keys/values) or in staging
  // (`staged`; copied to the host for the comparison, repeats only).
  absl::Status CheckRepeatChunk(const LayerState& layer, uint64_t first, int64_t count, const float* keys,
                                const float* values, const StagedTokens* staged, const std::string& id,
                                uint32_t layer_index) const;

  // Stores plan.fresh tokens (float [count][n], already bf16-representable
  // or not: they are rounded to bf16 here) using `pages` reserved pages.
  // On failure nothing of the layer changed; the caller frees the pages.
  // On success the layer owns them, except that for a hot layer they are
  // promoted to hot pages and freed here (when no hot page can be had even
  // after demoting other layers, the layer itself is demoted instead).
  // With `staged` set the tokens come from there (DEVICE INGEST) and
  // keys/values are ignored.
  absl::Status ApplyAppend(LayerState* layer, int layer_index, const AppendPlan& plan, const float* keys,
                           const float* values, const std::vector<PageId>& pages, const TierHeld& held,
                           const StagedTokens* staged = nullptr);
  // Adds encoded pages' statistics to the metrics and the totals.
  void RecordEncoded(const std::vector<EncodeJob>& jobs);
  // The header checks of Append (sequence id, layer, count, first token,
  // optional shape), in its order.
  absl::Status CheckHeader(const std::string& sequence_id, uint32_t layer, uint64_t first_token,
                           uint32_t token_count, const uint32_t* kv_heads, const uint32_t* head_dim) const;
  // Append after the checks: finds or creates the sequence, plans, reserves
  // and stores (from keys/values, or from `staged`), updates the totals.
  // Acts for `tenant`; `new_incarnation` as AppendChunk's.
  absl::Status StoreChunk(const std::string& tenant, const std::string& sequence_id, bool new_incarnation,
                          uint32_t layer, uint64_t first_token, uint32_t token_count, int dtype, const float* keys,
                          const float* values, const StagedTokens* staged, v1::AppendResponse* totals);

  // Attend in steps (handler_attend.cc): validate, lock, plan and apply
  // the decode steps, attend.
  struct AttendWork;
  class AttendLocks;
  absl::Status AttendImpl(const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant);
  absl::Status ValidateAttendItem(const v1::AttendItem& item, int index, AttendWork* work) const;
  // REQUIRES: the batch's locks held (AttendLocks).
  absl::Status PlanAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                               int64_t* total_pages) const;
  // Reserves total_pages pages, applies the planned steps; *used: pages
  // stored (the rest are freed). REQUIRES: the batch's locks held.
  absl::Status ApplyAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                                int64_t total_pages, size_t* used);
  // Where a page checksum was checked (label where= of
  // driftkv_page_checksum_failures_total).
  enum ChecksumSite : int { kCheckRead = 0, kCheckAttend = 1, kCheckDemote = 2, kCheckSnapshot = 3 };
  // DATA_LOSS naming the page, layer and sequence when cold page `page`
  // (page `index` of `layer`) does not match layer.page_sums[index];
  // counts the failure. REQUIRES: layer.mu held.
  absl::Status VerifyColdPage(const LayerState& layer, size_t index, PageId page, const std::string& id,
                              int layer_index, ChecksumSite site) const;
  void Touch(Sequence* seq) { seq->last_access_ns.store(absl::ToUnixNanos(clock_())); }
  void PublishGauges();

  // The hot tier (handler_tier.cc). REQUIRES for all: hot_pool_ set.
  // Before an Attend takes its locks: promotes (sync) or queues (async)
  // the request's cold layers. No lock held.
  void PrepareHotTier(const v1::AttendRequest& request, const std::string& tenant);
  // Promotes one layer, making room by demoting layers not in `exclude`.
  // No lock held. False when it stays cold (no room; a corrupt page).
  bool PromoteLayer(const SequencePtr& seq, int layer_index, const absl::flat_hash_set<uint64_t>& exclude);
  // `count` hot pages, demoting least recently attended layers until they
  // fit; RESOURCE_EXHAUSTED when nothing more can be demoted.
  absl::StatusOr<std::vector<PageId>> ReserveHot(int64_t count, const TierHeld& held);
  // Demotes the least recently attended layer that is not held and whose
  // locks are free; false when there is none.
  bool DemoteVictim(const TierHeld& held, absl::flat_hash_set<uint64_t>* tried);
  // Moves a hot layer's pages to the cold pool. REQUIRES: layer->mu held as
  // a writer and its sequence's mu; layer->hot.
  absl::Status DemoteLocked(LayerState* layer, DemotionReason reason);
  // Promotes `cold` (new pages of the hot `layer`); on success *hot holds
  // their hot pages (the caller frees `cold`). REQUIRES: layer->mu writer.
  absl::Status PromoteNewPages(LayerState* layer, const std::vector<PageId>& cold, const TierHeld& held,
                               std::vector<PageId>* hot);
  void DemoteIdle();
  void PromotionThread();
  void AddHot(const SequencePtr& seq, int layer_index, uint64_t id) ABSL_LOCKS_EXCLUDED(hot_mu_);
  void RemoveHot(uint64_t id) ABSL_LOCKS_EXCLUDED(hot_mu_);
  void TouchHot(uint64_t id, int64_t now_ns) ABSL_LOCKS_EXCLUDED(hot_mu_);

  const ServiceOptions options_;  // keeps options_.transforms alive for backend_
  const std::unique_ptr<const KvCodec> codec_;
  double transform_gain_ = 1.0;          // see value_limit()
  uint64_t transforms_checksum_ = 0;     // TransformsChecksum(*options_.transforms), for Info
  Metrics* const metrics_;
  const Clock clock_;
  TenantLedger ledger_;
  mutable Tombstones tombstones_;  // internally locked; Stats purges
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PagePool> hot_pool_;  // level pages; null without a hot tier
  std::unique_ptr<Backend> backend_;

  mutable absl::Mutex table_mu_;
  absl::flat_hash_map<std::string, SequencePtr> table_ ABSL_GUARDED_BY(table_mu_);
  std::vector<int64_t> device_sequences_ ABSL_GUARDED_BY(table_mu_);  // sequences per partition
  // The device index of each partition (options.devices, or the one
  // device) and its gauges (Metrics::device_*).
  std::vector<int> device_ids_;
  std::vector<prometheus::Gauge*> device_used_gauges_, device_sequence_gauges_;
  // The device slot for a new sequence: fewest pages in use, then fewest
  // sequences. REQUIRES: table_mu_ held.
  int LeastLoadedDevice() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);
  // Removes a sequence from the table, refunding its tenant's sequence
  // count and its device slot's. REQUIRES: table_mu_ held.
  void EraseLocked(decltype(table_)::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);

  // Totals over all sequences (read by Stats and the gauges).
  std::atomic<int64_t> tokens_compressed_{0};
  std::atomic<int64_t> tokens_window_{0};
  std::atomic<uint64_t> sequences_expired_{0};
  std::atomic<uint64_t> sequences_released_{0};
  std::atomic<uint64_t> tokens_ingested_{0};
  std::atomic<uint64_t> bytes_ingested_{0};
  std::atomic<uint64_t> attention_tokens_{0};
  std::atomic<bool> draining_{false};
  mutable std::atomic<uint64_t> checksum_failures_{0};
  std::atomic<uint64_t> snapshot_corrupt_pages_{0};
  std::atomic<uint64_t> snapshot_dropped_sequences_{0};
  std::atomic<uint64_t> restored_sequences_{0};
  mutable absl::Mutex stats_mu_;
  CodecStats codec_stats_ ABSL_GUARDED_BY(stats_mu_);

  // The hot tier's layers in least-recently-attended order (HOT TIER).
  struct HotEntry {
    SequencePtr seq;
    int layer = 0;
    int64_t attended_ns = 0;  // clock_ of the last Attend (or the promotion)
  };
  mutable absl::Mutex hot_mu_;
  absl::flat_hash_map<uint64_t, HotEntry> hot_layers_ ABSL_GUARDED_BY(hot_mu_);  // by LayerState::id
  std::set<std::pair<int64_t, uint64_t>> hot_lru_ ABSL_GUARDED_BY(hot_mu_);     // (attended_ns, id), oldest first
  std::atomic<uint64_t> promotions_{0};
  std::atomic<uint64_t> demotions_{0};
  std::atomic<uint64_t> pages_promoted_{0};
  std::atomic<uint64_t> pages_demoted_{0};
  // Async promotion: a queue of layers, one thread.
  absl::Mutex promote_mu_;
  std::deque<std::pair<SequencePtr, int>> promote_queue_ ABSL_GUARDED_BY(promote_mu_);
  bool promote_stop_ ABSL_GUARDED_BY(promote_mu_) = false;
  int promote_running_ ABSL_GUARDED_BY(promote_mu_) = 0;
  std::thread promoter_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_HANDLER_H_
