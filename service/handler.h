// The service's logic, without a network: validates, plans, and changes the
// stored sequences; returns absl::Status (grpc_service.h converts it at the
// edge). One file per RPC (handler_*.cc) over collaborators owning state:
// SequenceTable (which sequences exist: tenants, quotas, tombstones, device
// slots, release, expiry), HotTier (which layers are in the hot pool),
// PageVerifier (cold pages against their CRCs), the pools and the Backend;
// RegionTable (client memory *_ref fields name). Sequences: service/sequence.h.
//
// Rejected requests change nothing: every check runs and every page is reserved before the first mutation.
//
// INTEGRITY. A repeated Append of stored tokens is compared with what is
// stored before it is acknowledged (handler_repeat.cc): window tokens bit
// for bit as bf16, paged tokens by their TokenDigest kept at encoding; a
// mismatch is ALREADY_EXISTS naming the token range.
//
// LOCK ORDER across the service, outermost first:
//   SequenceTable::mu_   the table (never held while a sequence is locked);
//   Sequence::mu         several in ascending address order (only
//                        Attend locks several; any one total order does);
//   LayerState::mu       all Sequence::mu before any, layers in ascending
//                        (sequence address, layer) order (Attend, and
//                        Fork: every layer of its source as a reader);
//   TokenIds::mu         a sequence's token ids (service/sequence.h), under
//                        its layer's lock; nothing but the leaves under it;
//   PrefixIndex::mu_     the prefix index (service/prefix_index.h), taken
//                        under layer locks (Append inserts, Reserve
//                        reclaims, also from under HotTier's locks); only
//                        the pools' locks are taken under it;
//   leaves: HotTier::hot_mu_ and promote_mu_, ColdCopies::mu_ (the cold
//   pool's reclaimer takes it first, from under any of the above), the tenant ledger's, the
//   tombstones' and RegionTable's locks, the handler's totals, the pools';
//   nothing is acquired under them but the index's as said.
// So one sequence's layers ingest in parallel and many Attends share a layer. Attend promotes
// before it takes its batch's locks; demotion TryLocks its victim, so it may run under them.
// The disk level (service/spill_tier.h) restores a sequence before a request
// takes its locks; its moves down TryLock their victim's Sequence::mu as a
// writer, so they may run under any lock above; SpillTier::mu_ is a leaf.
#ifndef DRIFTKV_SERVICE_HANDLER_H_
#define DRIFTKV_SERVICE_HANDLER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/page_pool.h"
#include "codec/kv_codec.h"
#include "proto/driftkv.pb.h"
#include "service/attend_reuse.h"
#include "service/config.h"
#include "service/hot_tier.h"
#include "service/metrics.h"
#include "service/page_verifier.h"
#include "service/pin_table.h"
#include "service/pinned_staging.h"
#include "service/prefix_index.h"
#include "service/regions.h"
#include "service/sequence_table.h"
#include "service/spill_tier.h"

namespace driftkv {

constexpr const char* kServerVersion = "0.1.0";

struct StagedOutputs;         // service/attend_io.h
class SnapshotReader;         // service/snapshot_file.h
class SnapshotWriter;         // service/snapshot_file.h
class SnapshotPagesRestored;  // service/snapshot_pages.h
class SnapshotPagesWritten;   // service/snapshot_pages.h

class Handler {
 public:
  using Clock = ServiceClock;

  // Builds the codec, the pool arena and the backend. `metrics` must outlive
  // the handler; `clock` (for TTLs) defaults to absl::Now.
  static absl::StatusOr<std::unique_ptr<Handler>> Create(const ServiceOptions& options, Metrics* metrics,
                                                         Clock clock = nullptr);
  ~Handler();  // stops the promotion thread (async hot tier) first

  // Every call acts for `tenant` ("" without tokens; service/tenant.h).
  // One chunk of an Append stream; adds to `totals` when accepted.
  absl::Status Append(const v1::AppendChunk& chunk, v1::AppendResponse* totals, const std::string& tenant = "");
  // DEVICE INGEST (backends/backend.h, docs/nccl.md): a chunk whose keys and
  // values a transport received into staging memory of the backend
  // (backend().AllocateStaging). Exactly Append's semantics and messages:
  // all-or-nothing, tokens already stored acknowledged (after comparing
  // them with what is stored), gaps OUT_OF_RANGE, tenants and tombstones.
  // CheckChunkHeader runs the checks that need no tensor data (the
  // transport uses it before receiving); AppendStaged runs them again.
  absl::Status CheckChunkHeader(const v1::PushChunkRequest& header) const;
  absl::Status AppendStaged(const v1::PushChunkRequest& header, const StagedTokens& tokens, v1::AppendResponse* totals,
                            const std::string& tenant = "", absl::Span<const uint32_t> token_ids = {});
  // A chunk whose keys_ref/values_ref name a registered region: AppendStaged
  // of the region's memory (Append of an AppendChunk with refs comes here).
  absl::Status AppendReferenced(const v1::PushChunkRequest& header, v1::AppendResponse* totals,
                                const std::string& tenant = "", absl::Span<const uint32_t> token_ids = {});
  // Where *_ref fields resolve (null: nowhere); set once, before serving.
  void AttachRegions(RegionTable* regions) { regions_ = regions; }
  Backend& backend() { return *backend_; }
  // With `staged` set, inline outputs the device wrote into pinned staging
  // stay there, named in *staged, and their results' output fields stay
  // empty (service/attend_wire.h sends them from there).
  // With `reuse` set, the call keeps in it what the same request's next
  // call can use again, and uses what an earlier call kept
  // (service/attend_reuse.h); the answer is the same either way.
  // With `wire_queries` (one per item), the items' inline queries are read
  // from there, as the wire delivered them, instead of from their query
  // fields (service/attend_request_wire.h).
  absl::Status Attend(const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant = "",
                      StagedOutputs* staged = nullptr, AttendReuse* reuse = nullptr,
                      absl::Span<const absl::string_view> wire_queries = {});
  // Streams the answer through `sink`; false from it stops (Cancelled).
  absl::Status Read(const v1::ReadRequest& request, const std::function<bool(const v1::ReadChunk&)>& sink,
                    const std::string& tenant = "");
  // Frees the sequence, tombstones its id.
  absl::Status Release(const v1::ReleaseRequest& request, v1::ReleaseResponse* response,
                       const std::string& tenant = "");
  // Token counts of every layer; NOT_FOUND for an unknown sequence. Not an access for the TTL.
  absl::Status Length(const v1::LengthRequest& request, v1::LengthResponse* response, const std::string& tenant = "");
  // Creates request.sequence_id sharing the first request.tokens tokens
  // (whole pages) of every layer of request.source_sequence_id by
  // reference (handler_fork.cc, docs/prefix_cache.md): the same creation
  // rules and quotas as an Append's new sequence, each layer in its
  // source's tier with an empty window. All or nothing.
  // With prefix_token_ids or prefix_page_keys instead of a source: the
  // longest prefix the prefix index holds in every layer, cold.
  absl::Status Fork(const v1::ForkRequest& request, v1::ForkResponse* response, const std::string& tenant = "");
  // The longest prefix of a prompt the prefix index holds for `tenant`,
  // per layer and overall, and why the next page is not held
  // (handler_lookup.cc). Read-only.
  absl::Status Lookup(const v1::LookupRequest& request, v1::LookupResponse* response,
                      const std::string& tenant = "") const;
  // Brings the sequence's pages back into the pool from the disk level
  // (handler_prefetch.cc, docs/tiers.md); NOT_FOUND for an unknown
  // sequence. Without a disk level: OK, nothing restored.
  absl::Status Prefetch(const v1::PrefetchRequest& request, v1::PrefetchResponse* response,
                        const std::string& tenant = "");
  // Pins the longest prefix the prefix index holds for `tenant` in every
  // layer (at most request.tokens) for request.ttl_seconds, charged to the
  // tenant; a live pin of the same id is replaced (handler_pin.cc,
  // service/pin_table.h). NOT_FOUND when nothing is held, in the words of
  // an unknown prefix whatever tenant holds it.
  absl::Status Pin(const v1::PinRequest& request, v1::PinResponse* response, const std::string& tenant = "");
  // Removes a live pin of `tenant`; NOT_FOUND otherwise.
  absl::Status Unpin(const v1::UnpinRequest& request, v1::UnpinResponse* response, const std::string& tenant = "");
  // The longest lease a Pin may ask for (a week): pins end by themselves.
  static constexpr double kMaxPinSeconds = 7 * 24 * 3600.0;
  // Streams the prefix index's stored / evicted events of `tenant`'s pages
  // through `sink` from now on (handler_watch.cc, service/page_events.h)
  // until `stop` (asked at least every `poll`) says so or `sink` returns
  // false: then Cancelled. INVALID_ARGUMENT for sizes out of range,
  // RESOURCE_EXHAUSTED past PageEvents::kMaxSubscribers.
  absl::Status WatchPages(const v1::WatchPagesRequest& request,
                          const std::function<bool(const v1::PageEventBatch&)>& sink, const std::function<bool()>& stop,
                          const std::string& tenant = "", absl::Duration poll = absl::Milliseconds(200));
  // `tenant`: the caller's; with tokens, restored_sequences counts only
  // its own sequences.
  void Info(v1::InfoResponse* response, const std::string& tenant = "") const;
  void Stats(v1::StatsResponse* response, const std::string& tenant = "") const;

  // Releases sequences idle for longer than the TTL (none if it is 0);
  // returns how many. Also demotes hot layers not attended for
  // hot_idle_seconds (not counted). The server calls it periodically.
  int ExpireIdle();

  // GRACEFUL DRAIN AND WARM RESTART (handler_snapshot.cc;
  // docs/reliability.md). BeginDrain: from now on a chunk that would create
  // a sequence is refused with UNAVAILABLE naming the drain; existing
  // sequences are served as before.
  void BeginDrain() { table_->BeginDrain(); }
  bool draining() const { return table_->draining(); }
  struct SnapshotSummary {
    uint64_t sequences = 0;           // written / restored
    uint64_t pages = 0;               // the sequences' pages, shared ones once per holder
    uint64_t shared_pages = 0;        // page entries that repeat a page the file holds once
    uint64_t index_entries = 0;       // prefix index entries written / restored
    uint64_t pins = 0;                // pins written / restored
    uint64_t corrupt_pages = 0;       // checksum mismatches (pages and windows)
    uint64_t dropped_sequences = 0;   // not written / not restored, each logged
    uint64_t pages_on_host = 0;       // of `pages`: on the host level (bytes in the file)
    uint64_t pages_on_disk = 0;       // of `pages`: named by their disk level record
    int64_t disk_records_erased = 0;  // load: records of the disk level no sequence named
    std::string disk_level_open;      // load: how the disk level's index was restored ("" without one)
    bool rest_lost = false;           // load: a corrupt framing field ended the reading early
    std::string path;
    bool found = false;             // load: a snapshot file was there
    std::string removed_temporary;  // load: a leftover snapshot.dkvs.tmp, removed ("" if none)
    std::string already_loaded;     // load, none found: snapshot.dkvs.loaded of an earlier start, if there
  };
  // The start's line about the load into `summary` (LoadSnapshot's), e.g.
  // "restored 3 sequences (12 pages) from DIR/snapshot.dkvs; ..." or "no
  // snapshot in DIR; nothing restored", naming a removed temporary file.
  static std::string RestoreReport(const std::string& dir, const SnapshotSummary& summary);
  // Writes every sequence to `dir` (service/snapshot_file.h), hot layers in
  // their cold form (demoted first; a layer that cannot be demoted or whose
  // page fails its checksum drops its sequence, counted and logged). Call
  // after the RPCs have stopped; takes every lock meanwhile.
  absl::Status WriteSnapshot(const std::string& dir, SnapshotSummary* summary);
  // Restores the snapshot in `dir`, verifying every page; call once, on an
  // empty handler, before serving. NotFound when there is none (then
  // summary->found is false); a leftover temporary file of an interrupted
  // write (never a whole snapshot) is removed first, and named in
  // summary->removed_temporary;
  // FailedPrecondition naming the field for another codec/shape
  // (SnapshotIdentity). A sequence with a corrupt page or window, or that no
  // longer fits, is dropped (logged, counted in *summary, Stats, metrics).
  // The file is renamed to snapshot.dkvs.loaded (no resurrection by a crash).
  absl::Status LoadSnapshot(const std::string& dir, SnapshotSummary* summary);
  // What a snapshot's pages depend on (codec, shape, format, window, transform), "key=value" lines.
  std::string SnapshotIdentity() const;

  // Async hot tier: waits until every queued promotion has run (tests and
  // benchmarks); returns at once otherwise.
  void DrainPromotions();
  // Whether the layer's pages are hot (false for an unknown sequence).
  bool LayerIsHot(const std::string& sequence_id, uint32_t layer);
  // TESTS ONLY: runs `fn` on layer `layer` of the sequence at table key
  // `key` under the sequence's and the layer's locks (writer), the way a
  // fault would reach memory: tests/page_checksum_test.cc flips bytes of
  // windows and finds the pages to corrupt. False for an unknown sequence.
  bool WithLayerForTest(const std::string& key, uint32_t layer, const std::function<void(LayerState&)>& fn);

  const ServiceOptions& options() const { return options_; }
  // The codec (codec.name) behind its interface; pages have its page_format.
  const KvCodec& codec() const { return *codec_; }
  const PagePool& pool() const { return *pool_; }
  // Full cold pages by content (service/prefix_index.h).
  PrefixIndex& prefix_index() { return *index_; }
  // Subscribers of WatchPages (service/page_events.h).
  PageEvents& page_events() { return *events_; }
  // Pinned prefixes (service/pin_table.h).
  const PinTable& pins() const { return *pins_; }
  // The hot tier's pool of level pages, or null without one.
  const PagePool* hot_pool() const { return hot_pool_.get(); }
  // The disk level below the pool (service/spill_tier.h), or null.
  SpillTier* spill_tier() { return spill_.get(); }

 private:
  // How one append of `count` tokens starting at `first` lands on a layer.
  struct AppendPlan {
    int64_t skip = 0;   // leading tokens already stored
    int64_t fresh = 0;  // tokens to store
    int64_t pages = 0;  // pages to encode
  };
  // New tokens [count][n] as the host holds them: floats (an Append
  // chunk), or bf16 (a decode step, kept in the window's own form from the
  // wire on: no round trip through floats).
  struct HostTokens {
    const float* keys = nullptr;
    const float* values = nullptr;
    const uint16_t* keys_bf16 = nullptr;  // set: the tokens are these
    const uint16_t* values_bf16 = nullptr;
    // Elements [first, first + count) of the keys and of the values, in bf16.
    void CopyBf16(size_t first, size_t count, uint16_t* k, uint16_t* v) const;
  };
  class AttendBatch;  // one Attend call in steps (handler_attend.cc)
  // What the handler has done, for Stats (codec_mu is a leaf lock).
  struct Totals {
    std::atomic<uint64_t> tokens_ingested{0}, bytes_ingested{0}, attention_tokens{0};
    std::atomic<uint64_t> snapshot_corrupt_pages{0}, snapshot_dropped_sequences{0};
    absl::Mutex codec_mu;
    CodecStats codec ABSL_GUARDED_BY(codec_mu);
  };

  Handler(const ServiceOptions& options, std::unique_ptr<KvCodec> codec, Metrics* metrics)
      : options_(options), codec_(std::move(codec)), metrics_(metrics) {}

  // Largest |x| accepted in keys and values, so that a windowed token always encodes later:
  // the transform and mean subtraction grow a value by up to 2 G (G = TransformGain, the
  // largest absolute row sum of the stage's matrices) and fp16 must still hold it.
  float value_limit() const;
  static double TransformGain(const ServiceOptions& options);
  int n() const { return codec_->n(); }
  absl::Status CheckLayer(absl::string_view field, uint32_t layer) const;
  absl::Status CheckSequenceId(absl::string_view field, const std::string& id) const;
  // The header checks of Append and AppendStaged, in Append's order.
  absl::Status CheckHeader(const std::string& sequence_id, uint32_t layer, uint64_t first_token, uint32_t token_count,
                           const uint32_t* kv_heads, const uint32_t* head_dim) const;
  // Where `count` tokens at `first` land; OUT_OF_RANGE on a gap. `length`,
  // `window`: the layer's token counts (in a batch: after earlier items).
  absl::StatusOr<AppendPlan> PlanAppend(int64_t length, int64_t window, absl::string_view where, const std::string& id,
                                        uint32_t layer, uint64_t first, int64_t count) const;
  // The `count` repeated tokens at `first` equal the stored ones, else
  // ALREADY_EXISTS naming the range (handler_repeat.cc); the chunk form
  // takes them from the host or from staging. REQUIRES: layer.mu held.
  absl::Status CheckRepeat(const LayerState& layer, uint64_t first, int64_t count, const HostTokens& tokens,
                           absl::string_view where, const std::string& id, uint32_t layer_index) const;
  absl::Status CheckRepeatChunk(const LayerState& layer, uint64_t first, int64_t count, const float* keys,
                                const float* values, const StagedTokens* staged, const std::string& id,
                                uint32_t layer_index) const;
  // Stores plan.fresh tokens (float [count][n], rounded to bf16 here; or
  // `staged`) using `pages` reserved cold pages; on failure nothing changed
  // and the caller frees them; on success the layer owns them (a hot layer's
  // go hot: HotTier::PlaceNewPages, which changes `usage`'s bytes for
  // them). The caller has charged AppendBytes(plan) to `usage`, the
  // layer's tenant. The window's tokens that are encoded into pages are
  // checked first (DATA_LOSS naming `name`'s window), and the window's
  // checksums follow its tokens (LayerState::window_sums).
  // REQUIRES: layer->mu held as a writer.
  // With `sealed`, its first sealed->keyed new pages are also handed out
  // for the prefix index (sealed->pages: their cold pages, each with a
  // reference of its own, checksums and digests), on success only.
  struct SealedPages {
    int64_t keyed = 0;
    std::vector<PrefixIndex::Page> pages;
  };
  absl::Status ApplyAppend(LayerState* layer, TenantUsage* usage, const LayerName& name, const AppendPlan& plan,
                           const HostTokens& tokens, const std::vector<PageId>& pages, const HotTier::Held& held,
                           const StagedTokens* staged = nullptr, SealedPages* sealed = nullptr);
  // One append that encodes pages, as ApplyAppend takes it, between the
  // phases that SealAppends runs over several (handler_store.cc).
  struct Sealing {
    LayerState* layer = nullptr;
    TenantUsage* usage = nullptr;
    LayerName name;
    AppendPlan plan;
    HostTokens tokens;
    const StagedTokens* staged = nullptr;
    std::vector<PageId> pages;
    SealedPages* sealed = nullptr;
    // What the phases find and make.
    int64_t window = 0;                 // the window's tokens before
    const uint16_t* fresh_k = nullptr;  // host tokens: the new ones in bf16
    const uint16_t* fresh_v = nullptr;
    std::vector<uint16_t> all_k, all_v;  // staged: the window after
    std::vector<EncodeJob> jobs;
    std::vector<PageChecksum> window_sums;     // of the window after
    std::vector<uint64_t> digests;             // of the tokens encoded
    std::vector<PageChecksum> sums, hot_sums;  // the pages' cold and hot forms
    std::vector<PageId> hot;                   // hot pages, when they went hot
    // Hot pages taken before encoding, for pages encoded straight into
    // level form (an empty reservation: encoded cold).
    HotTier::NewPagesReservation straight;
    // Token t of [window; new tokens] (t >= the tokens encoded, when staged).
    const uint16_t* KeyRow(int64_t t, size_t n, int64_t encoded) const;
    const uint16_t* ValueRow(int64_t t, size_t n, int64_t encoded) const;
  };
  // ApplyAppend of each of `items` (plan.pages > 0, each on a layer of its
  // own, every layer->mu held as a writer): encoded, checksummed and
  // promoted together, as many at a time as a thread's scratch holds. On
  // an error *stored items were stored, items[*stored] failed as
  // ApplyAppend would have and the rest are untouched.
  absl::Status SealAppends(absl::Span<Sealing> items, const HotTier::Held& held, size_t* stored);
  // The phases of SealAppends over one group (handler_store.cc); on an
  // error *stored of them were stored and *culprit is the item whose own
  // check failed, or ~0 when a step of the whole group did.
  absl::Status SealGroup(absl::Span<Sealing> items, const HotTier::Held& held, size_t* stored, size_t* culprit);
  absl::Status PrepareSeal(Sealing* s, float* keys, float* values, uint16_t* fresh_k, uint16_t* fresh_v);
  // Hot pages for the items whose new pages are encoded straight into
  // level form (Sealing::straight); on an error *culprit is the item.
  absl::Status ReserveStraight(absl::Span<Sealing> items, const HotTier::Held& held, size_t* culprit);
  // The group's encoding: EncodePages for cold pages, EncodeLevelPages for
  // the straight ones (their cold and hot checksums come back with them).
  absl::Status EncodeGroup(absl::Span<Sealing> items);
  absl::Status CheckSeal(Sealing* s);
  absl::Status PlaceSealed(absl::Span<Sealing> items, const HotTier::Held& held, size_t* stored, size_t* culprit);
  void CommitSeal(Sealing* s);
  // An encoding failure of `s`, naming its tokens.
  absl::Status EncodingError(const Sealing& s, const absl::Status& st) const;
  // What storing `plan` changes in its tenant's bytes: its pages as cold
  // pages, its window by fresh tokens less those the pages take out.
  HeldBytes AppendBytes(const AppendPlan& plan) const;
  void RecordEncoded(absl::Span<const EncodeJob> jobs);
  // Append after the checks: finds or creates the sequence, plans,
  // reserves and stores, updates the totals.
  absl::Status StoreChunk(const std::string& tenant, const std::string& sequence_id, bool new_incarnation,
                          uint32_t layer, uint64_t first_token, uint32_t token_count, int dtype, const float* keys,
                          const float* values, const StagedTokens* staged, v1::AppendResponse* totals,
                          absl::Span<const uint32_t> token_ids);
  // The namespace of `tenant`'s page keys under this codec (page_key.h):
  // its shared prefix namespace's when the config puts it in one.
  PageKey NamespaceOf(const std::string& tenant) const;
  // The shared prefix namespace `tenant` is in (config prefix_namespaces),
  // or null.
  const std::string* SharedNamespaceName(const std::string& tenant) const;
  // SNAPSHOT PAGES (handler_snapshot.cc). One page entry for namespace
  // `space` (the bytes of its NamespaceOf): a repeat of a page the file
  // holds, or the page itself.
  absl::Status WritePage(SnapshotWriter* writer, SnapshotPagesWritten* written, const std::string& space, PageId page,
                         PageChecksum sum, SnapshotSummary* summary);
  // The prefix index (least recent first) and the live pins, after the
  // sequences (version 4).
  absl::Status WriteIndexAndPins(SnapshotWriter* writer, SnapshotPagesWritten* written, SnapshotSummary* summary);
  // One page entry read into a page of its own (partition 0) or the page
  // restored for the full entry it repeats (wherever it lies), with a
  // reference for the caller; kNone when it failed its checksum or
  // repeats a page not restored. Not OK: the framing (the rest is lost).
  absl::Status ReadRestoredPage(SnapshotReader* reader, SnapshotPagesRestored* restored, PageId* page,
                                PageChecksum* sum, SnapshotSummary* summary);
  // The index and the pins after the sequences, then the trailer: read
  // whole, uploaded to the backend, then entered (an upload that fails
  // enters nothing, logged).
  absl::Status LoadIndexAndPins(SnapshotReader* reader, SnapshotPagesRestored* restored, SnapshotSummary* summary);
  // The page keys of a prompt given as ids or keys (`ids_field`,
  // `keys_field`: the request's field names, for messages); exactly one
  // of them non-empty, keys of 16 bytes.
  absl::Status PromptKeys(absl::string_view ids_field, absl::Span<const uint32_t> ids, absl::string_view keys_field,
                          const google::protobuf::RepeatedPtrField<std::string>& keys, std::vector<PageKey>* out) const;
  // The page keys of a request's prefix (prefix_token_ids or
  // prefix_page_keys, PromptKeys) and how many whole pages it may take
  // (`most`): tokens / page_tokens, all of them for tokens 0. `bound` and
  // `whole` end the messages of a tokens that is not a multiple of
  // page_tokens and of a prefix shorter than a page (what the request
  // does with its pages, in words).
  absl::Status PrefixPages(uint64_t tokens, absl::Span<const uint32_t> ids,
                           const google::protobuf::RepeatedPtrField<std::string>& page_keys, absl::string_view bound,
                           absl::string_view whole, std::vector<PageKey>* keys, int64_t* most) const;
  // Why page `page` of a prompt is not held, in words.
  std::string MissMessage(const PrefixIndex::Match& m, const std::string& tenant) const;
  // FORK (handler_fork.cc): from the prefix index; and the steps any fork
  // ends with: the tenant's charge for `shared` pages and the fork's bytes,
  // then the table's Insert (every reference and charge given back on a
  // refusal), the counts and the answer.
  absl::Status ForkFromPrefix(const v1::ForkRequest& request, v1::ForkResponse* response, const std::string& tenant);
  absl::Status EnterFork(const SequencePtr& fork, const std::string& id, bool new_incarnation, int64_t shared,
                         uint64_t tokens, v1::ForkResponse* response);
  void PublishGauges();
  // THE DISK LEVEL: pins `seq` into *pins and brings its pages back when
  // they are below (SpillTier::Restore; `id` names it in messages). OK at
  // once without a disk level (nothing pinned). REQUIRES: none of seq's
  // locks held; *pins lives until the caller's locks of seq are taken.
  absl::Status Resident(Sequence* seq, absl::string_view id, std::vector<SpillPin>* pins, int64_t* restored = nullptr);

  const ServiceOptions options_;  // keeps options_.transforms alive for backend_
  const std::unique_ptr<const KvCodec> codec_;
  double transform_gain_ = 1.0;       // see value_limit()
  uint64_t transforms_checksum_ = 0;  // TransformsChecksum(*options_.transforms)
  Metrics* const metrics_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PagePool> hot_pool_;  // level pages; null without a hot tier
  std::unique_ptr<Backend> backend_;
  // Inline Attend tensors the device reads and writes; null unless the
  // backend addresses client memory. Declared after backend_: goes first.
  std::unique_ptr<PinnedStagingPool> inline_staging_;
  std::unique_ptr<PageVerifier> verifier_;
  std::unique_ptr<HotTier> hot_;  // null without a hot tier
  std::unique_ptr<SequenceTable> table_;
  // Holds references into pool_ (whose reclaimer it is): declared after
  // it, so destroyed first.
  // Told of the index's entries: declared before it, so destroyed after.
  std::unique_ptr<PageEvents> events_;
  std::unique_ptr<PrefixIndex> index_;
  // Holds references into pool_ and charges in table_'s ledger: declared
  // after both, so destroyed first.
  std::unique_ptr<PinTable> pins_;
  Clock clock_;                 // pin leases
  std::string codec_identity_;  // SnapshotIdentity(), for NamespaceOf
  RegionTable* regions_ = nullptr;
  mutable Totals totals_;
  // Null without config host_level or disk_level. Last: it is the pool's reclaimer and
  // the table's hooks point at it, and its eraser thread goes first.
  std::unique_ptr<SpillTier> spill_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_HANDLER_H_
