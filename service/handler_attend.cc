// Handler::Attend: validates every item, locks the sequences and layers in
// order, applies the decode steps all-or-nothing, then runs every item as
// one backend call.
#include "service/handler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "backends/attend_phases.h"
#include "service/attend_io.h"
#include "service/handler_internal.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::kMaxTokenIndex;
using handler_internal::Quoted;

namespace {

// The fields of an item that AttendIo::Keepable accepts: its tensors are
// where the client put them, so no vector of the ItemIo is in use.
void CopyKeptFields(const ItemIo& from, ItemIo* to) {
  to->query_dev = from.query_dev;
  to->query_dtype = from.query_dtype;
  to->query_host = from.query_host;
  to->query_host_dtype = from.query_host_dtype;
  to->query_by_ref = from.query_by_ref;
  to->out_dtype = from.out_dtype;
  to->out_ref = from.out_ref;
  to->lse_ref = from.lse_ref;
  to->out_ref_device = from.out_ref_device;
}

}  // namespace

// One Attend call in steps: validate (tensors inline or by reference:
// service/attend_io.h), find the sequences, bring the layers to the hot
// tier, lock, plan and apply the decode steps, attend. Its host work per
// item is constant: no std::map, no string built unless an error needs it.
class Handler::AttendBatch {
 public:
  // One item of an Attend request, validated and decoded.
  struct AttendWork {
    ItemIo io;  // query, decode step and output (service/attend_io.h)
    float scale = 0.0f;
    Sequence* seq = nullptr;
    LayerState* layer = nullptr;
    AppendPlan plan;

    // Back to a fresh item, keeping the io's vectors (ItemIo::Reset).
    void Reset() {
      AttendWork fresh;
      fresh.io = std::move(io);
      fresh.io.Reset();
      *this = std::move(fresh);
    }
  };
  // The calling thread's items, reused call after call (a doorbell's or a
  // stream's thread makes every call of its decode loop): `items` of them,
  // each Reset. Bounded by max_batch items per thread.
  static std::vector<AttendWork>& ThreadItems(int items) {
    thread_local std::vector<AttendWork> storage;
    storage.resize(items);  // exactly: callers walk the whole vector
    for (int i = 0; i < items; ++i) storage[i].Reset();
    return storage;
  }

  // The locks of one Attend batch, taken in the order of handler.h: every
  // sequence (readers, address order), then every layer ((sequence
  // address, layer) order; writers where a decode step appends).
  class AttendLocks {
   public:
    // Finds the items' sequences (one lookup per distinct sequence_id);
    // NOT_FOUND naming the first missing one.
    absl::Status Find(const SequenceTable& table, const v1::AttendRequest& request, const std::string& tenant,
                      std::vector<AttendWork>* work) {
      absl::flat_hash_map<absl::string_view, int> by_id;  // index into held_
      by_id.reserve(request.items_size());
      item_seq_.resize(request.items_size());
      layers_.reserve(request.items_size());
      absl::InlinedVector<absl::string_view, 64> ids;  // each distinct sequence_id once
      for (int i = 0; i < request.items_size(); ++i) {
        auto [slot, fresh] = by_id.try_emplace(request.items(i).sequence_id(), static_cast<int>(ids.size()));
        if (fresh) ids.push_back(request.items(i).sequence_id());
        item_seq_[i] = slot->second;
      }
      table.FindAll(tenant, absl::MakeConstSpan(ids), &held_);
      for (int i = 0; i < request.items_size(); ++i) {
        const v1::AttendItem& it = request.items(i);
        Sequence* seq = held_[item_seq_[i]].get();
        if (seq == nullptr) {
          return absl::NotFoundError(
              absl::StrCat("items[", i, "].sequence_id ", Quoted(it.sequence_id()), " not found"));
        }
        AttendWork& w = (*work)[i];
        w.seq = seq;
        w.layer = &seq->layers[it.layer()];
        layers_.push_back({w.layer, seq, it.layer(), w.io.step});
      }
      for (const SequencePtr& seq : held_) seqs_.push_back({seq.get(), false});
      // Lock order (handler.h): sequences by address; layers by (sequence
      // address, layer), each once (a writer if any of its items steps).
      // Addresses, not ids: no string compares.
      std::sort(seqs_.begin(), seqs_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::sort(layers_.begin(), layers_.end(), [](const LayerLock& a, const LayerLock& b) {
        return a.seq != b.seq ? a.seq < b.seq : a.index < b.index;
      });
      size_t out = 0;
      for (size_t k = 0; k < layers_.size(); ++k) {
        if (out > 0 && layers_[out - 1].layer == layers_[k].layer) {
          layers_[out - 1].writer = layers_[out - 1].writer || layers_[k].writer;
        } else {
          layers_[out++] = layers_[k];
        }
      }
      layers_.resize(out);
      return absl::OkStatus();
    }
    // The sequence of item `i`.
    const SequencePtr& sequence(int i) const { return held_[item_seq_[i]]; }
    // The analysis cannot follow a lock set of run-time size: Lock, Unlock
    // and what runs under them carry ABSL_NO_THREAD_SAFETY_ANALYSIS.
    void Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (auto& [seq, unused] : seqs_) seq->mu.ReaderLock();
      for (const LayerLock& l : layers_) {
        if (l.writer) {
          l.layer->mu.Lock();
        } else {
          l.layer->mu.ReaderLock();
        }
      }
    }
    void Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (const LayerLock& l : layers_) {
        if (l.writer) {
          l.layer->mu.Unlock();
        } else {
          l.layer->mu.ReaderUnlock();
        }
      }
      for (auto& [seq, unused] : seqs_) seq->mu.ReaderUnlock();
    }
    // Whether a sequence was released. REQUIRES: Lock() held.
    bool AnyReleased() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (const auto& [seq, unused] : seqs_) {
        if (seq->released) return true;
      }
      return false;
    }
    void TouchAll(const SequenceTable& table) {
      const int64_t now = table.NowNs();
      for (auto& [seq, unused] : seqs_) seq->last_access_ns.store(now);
    }

   private:
    struct LayerLock {
      LayerState* layer;
      Sequence* seq;
      uint32_t index;
      bool writer;
    };
    std::vector<SequencePtr> held_;  // each sequence once
    std::vector<int> item_seq_;      // item -> index into held_
    std::vector<std::pair<Sequence*, bool>> seqs_;
    std::vector<LayerLock> layers_;
  };

  // What an AttendReuse keeps (service/attend_reuse.h): the items'
  // resolved tensors, the regions they lie in (held mapped) and the
  // sequences with their lock order.
  struct Kept {
    std::string tenant;
    std::vector<ItemIo> io;
    std::vector<float> scale;
    std::vector<uint64_t> regions;  // ids (never reused), looked up again at each use
    AttendLocks locks;
  };

  AttendBatch(Handler& h, const std::string& tenant)
      : h_(h),
        io_(h.regions_, h.inline_staging_.get(), h.backend_.get(), tenant, h.codec_->head_dim(), h.n(),
            h.value_limit()) {}
  absl::Status Run(const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant,
                   StagedOutputs* staged, AttendReuse* reuse);
  void UseWireQueries(absl::Span<const absl::string_view> queries) { io_.UseWireQueries(queries); }

 private:
  // Whether an item's layer is in the cold tier (a decode loop's layers
  // are hot call after call: then the hot tier has nothing to do).
  // REQUIRES: the batch's locks held.
  static bool AnyCold(const std::vector<AttendWork>& work) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const AttendWork& w : work) {
      if (!w.seq->released && !w.layer->hot) return true;
    }
    return false;
  }
  // Without the batch's locks: promotes (sync) or queues (async) the
  // items' cold layers (HotTier::Prepare); DATA_LOSS "items[i]: ..." when
  // a sync promotion finds a corrupt cold page. REQUIRES: h_.hot_ set.
  absl::Status PrepareHotTier(const v1::AttendRequest& request, const std::vector<AttendWork>& work,
                              const AttendLocks& locks);
  absl::Status ValidateAttendItem(const v1::AttendItem& item, int index, AttendWork* work);
  // Takes the items' tensors from `kept` when every region they lie in is
  // still the tenant's (looked up again: held for the call, leases
  // extended); false when one is gone (then nothing of `kept` is used).
  bool UseKept(const Kept& kept, const std::string& tenant, std::vector<AttendWork>* work);
  // What a later call of the same request can use again; null when the
  // request is not one to keep (AttendIo::Keepable). Takes `locks`.
  std::shared_ptr<Kept> Keep(const std::vector<AttendWork>& work, const std::string& tenant, AttendLocks* locks);
  // An item's decode-step token, in bf16.
  static HostTokens StepTokens(const AttendWork& w) {
    return HostTokens{nullptr, nullptr, w.io.key16.data(), w.io.value16.data()};
  }
  // REQUIRES: the batch's locks held (AttendLocks).
  absl::Status PlanAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                               int64_t* total_pages) const ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Item `i` repeats token `first`, which item `e` of the same batch adds:
  // ALREADY_EXISTS, as for a stored token (Handler::CheckRepeat), unless
  // both carry the same bf16 data.
  absl::Status CheckRepeatInBatch(const AttendWork& earlier, int e, const AttendWork& w, int i, uint64_t first,
                                  const v1::AttendItem& it) const;
  // Reserves total_pages pages, applies the planned steps; *used: pages
  // stored (the rest are freed). REQUIRES: the batch's locks held.
  absl::Status ApplyAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work, int64_t total_pages,
                                size_t* used);

  Handler& h_;
  AttendIo io_;
};

absl::Status Handler::Attend(const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant,
                             StagedOutputs* staged, AttendReuse* reuse,
                             absl::Span<const absl::string_view> wire_queries) {
  AttendPhaseClock::Start();
  absl::Status st;
  {
    AttendBatch batch(*this, tenant);
    batch.UseWireQueries(wire_queries);
    st = batch.Run(request, response, tenant, staged, reuse);
  }  // the batch's teardown (its locks' and regions' references) is `finish`
  if (!st.ok()) {
    if (staged != nullptr) *staged = StagedOutputs();  // may name staging given back
    metrics_->rejected_chunks->Increment();
    return st;
  }
  AttendPhaseClock::Mark(AttendPhase::kFinish);
  metrics_->RecordAttendPhases();
  return st;
}

absl::Status Handler::AttendBatch::PrepareHotTier(const v1::AttendRequest& request, const std::vector<AttendWork>& work,
                                                  const AttendLocks& locks) {
  // The request's layers, each once; they are never demoted to make room
  // for each other.
  std::vector<std::pair<SequencePtr, int>> layers;
  std::vector<int> item;  // the first item of each of `layers`
  absl::flat_hash_set<uint64_t> ids;
  for (int i = 0; i < request.items_size(); ++i) {
    if (ids.insert(work[i].layer->id).second) {
      layers.emplace_back(locks.sequence(i), request.items(i).layer());
      item.push_back(i);
    }
  }
  size_t failed = 0;
  absl::Status st = h_.hot_->Prepare(layers, ids, &failed);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("items[", item[failed], "]: ", st.message()));
}

absl::Status Handler::AttendBatch::ValidateAttendItem(const v1::AttendItem& it, int i, AttendWork* w) {
  const int d = h_.codec_->head_dim(), kv_heads = h_.codec_->kv_heads();
  // Field names are built only for a message.
  auto where = [i](absl::string_view field) { return absl::StrCat("items[", i, "]", field); };
  if (it.sequence_id().empty() || it.sequence_id().size() > kMaxSequenceIdBytes ||
      handler_internal::ControlByteOffset(it.sequence_id()) >= 0) {
    return h_.CheckSequenceId(where(".sequence_id"), it.sequence_id());
  }
  if (it.layer() >= static_cast<uint32_t>(h_.options_.layers)) return h_.CheckLayer(where(".layer"), it.layer());
  if (it.has_head_dim() && it.head_dim() != static_cast<uint32_t>(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(".head_dim "), it.head_dim(), " does not match the server's head_dim ", d));
  }
  if (it.q_heads() == 0 || it.q_heads() % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(".q_heads "), it.q_heads(), " is not a positive multiple of kv_heads ", kv_heads));
  }
  if (it.q_heads() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(where(".q_heads "), it.q_heads(), " exceeds 65536"));
  }
  const size_t qe = static_cast<size_t>(it.q_heads()) * d;
  if (absl::Status st = io_.Prepare(it, i, qe, &w->io); !st.ok()) return st;
  if (!w->io.step && it.has_new_token_index()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(".new_token_index "), it.new_token_index(), " is set but new_key/new_value are empty"));
  }
  if (it.has_new_token_index() && it.new_token_index() > kMaxTokenIndex) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(".new_token_index "), it.new_token_index(), " exceeds ", kMaxTokenIndex));
  }
  w->scale = it.has_softmax_scale() ? it.softmax_scale() : 1.0f / std::sqrt(static_cast<float>(d));
  if (!(std::isfinite(w->scale) && w->scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(where(".softmax_scale "), w->scale, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

bool Handler::AttendBatch::UseKept(const Kept& kept, const std::string& tenant, std::vector<AttendWork>* work) {
  if (kept.tenant != tenant || kept.io.size() != work->size()) return false;
  if (!io_.AcquireAgain(absl::MakeConstSpan(kept.regions))) return false;
  for (size_t i = 0; i < work->size(); ++i) {
    AttendWork& w = (*work)[i];
    CopyKeptFields(kept.io[i], &w.io);
    w.scale = kept.scale[i];
  }
  return true;
}

std::shared_ptr<Handler::AttendBatch::Kept> Handler::AttendBatch::Keep(const std::vector<AttendWork>& work,
                                                                       const std::string& tenant, AttendLocks* locks) {
  absl::InlinedVector<const ItemIo*, 64> items;
  for (const AttendWork& w : work) items.push_back(&w.io);
  if (h_.spill_ != nullptr || !io_.Keepable(absl::MakeConstSpan(items))) return nullptr;
  auto kept = std::make_shared<Kept>();
  kept->tenant = tenant;
  kept->io.resize(work.size());
  kept->scale.resize(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    CopyKeptFields(work[i].io, &kept->io[i]);
    kept->scale[i] = work[i].scale;
  }
  for (const std::shared_ptr<const Region>& r : io_.regions()) kept->regions.push_back(r->id());
  kept->locks = std::move(*locks);
  return kept;
}

absl::Status Handler::AttendBatch::CheckRepeatInBatch(const AttendWork& earlier, int e, const AttendWork& w, int i,
                                                      uint64_t first, const v1::AttendItem& it) const {
  if (earlier.io.key16 == w.io.key16 && earlier.io.value16 == w.io.value16) return absl::OkStatus();
  h_.metrics_->integrity_rejections[kRejectRepeat]->Increment();
  return absl::AlreadyExistsError(absl::StrCat("items[", i, "].new_key/new_value of tokens [", first, ", ", first + 1,
                                               ") of layer ", it.layer(), " of sequence_id ", Quoted(it.sequence_id()),
                                               " differ from those of items[", e,
                                               "] of the same call (compared as bf16); nothing stored"));
}

absl::Status Handler::AttendBatch::PlanAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                                                   int64_t* total_pages) const {
  // Simulated (length, window) per layer: items of one batch may share a layer.
  absl::flat_hash_map<const LayerState*, std::pair<int64_t, int64_t>> sim;
  // Which item of the batch planned each token it adds: a later item that
  // repeats that token must carry the same data, as it would have to if the
  // two were sent as two calls.
  absl::flat_hash_map<std::pair<const LayerState*, uint64_t>, int> planned;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::AttendItem& it = request.items(i);
    AttendWork& w = (*work)[i];
    if (w.seq->released) {
      return absl::NotFoundError(
          absl::StrCat("items[", i, "].sequence_id ", Quoted(it.sequence_id()), " not found (released)"));
    }
    const LayerState& layer = *w.layer;
    if (!w.io.step) {
      if (layer.length == 0 && sim.find(&layer) == sim.end()) {
        return absl::FailedPreconditionError(absl::StrCat("items[", i, "]: layer ", it.layer(), " of sequence_id ",
                                                          Quoted(it.sequence_id()),
                                                          " holds no tokens; nothing to attend to"));
      }
      continue;  // the layer as it is (or as earlier steps of the batch leave it)
    }
    auto found = sim.find(&layer);
    if (found == sim.end()) {
      found = sim.emplace(&layer, std::make_pair(layer.length, static_cast<int64_t>(layer.window_keys.size() / h_.n())))
                  .first;
    }
    auto& [length, window] = found->second;
    {
      const uint64_t first = it.has_new_token_index() ? it.new_token_index() : length;
      absl::StatusOr<AppendPlan> plan = h_.PlanAppend(length, window, absl::StrCat("items[", i, "].new_token_index"),
                                                      it.sequence_id(), it.layer(), first, 1);
      if (!plan.ok()) return plan.status();
      w.plan = *plan;
      // A repeated step (new_token_index below the length) must carry the
      // stored token, or the token an earlier item of the batch planned
      // (not stored yet: compared with that item's data).
      if (plan->skip > 0 && static_cast<int64_t>(first) < layer.length) {
        absl::Status st =
            h_.CheckRepeat(layer, first, 1, StepTokens(w), absl::StrCat("items[", i, "].new_key/new_value"),
                           it.sequence_id(), it.layer());
        if (!st.ok()) return st;
      } else if (plan->skip > 0) {
        auto earlier = planned.find(std::make_pair(&layer, first));
        if (earlier != planned.end()) {
          absl::Status st = CheckRepeatInBatch((*work)[earlier->second], earlier->second, w, i, first, it);
          if (!st.ok()) return st;
        }
      } else {
        planned.emplace(std::make_pair(&layer, first), i);
      }
      length += plan->fresh;
      window += plan->fresh - plan->pages * h_.pool_->page_tokens();
      *total_pages += plan->pages;
    }
    if (length == 0) {
      return absl::FailedPreconditionError(absl::StrCat("items[", i, "]: layer ", it.layer(), " of sequence_id ",
                                                        Quoted(it.sequence_id()),
                                                        " holds no tokens; nothing to attend to"));
    }
  }
  return absl::OkStatus();
}

absl::Status Handler::AttendBatch::ApplyAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                                                    int64_t total_pages, size_t* used) {
  if (total_pages == 0 && std::none_of(work->begin(), work->end(), [](const AttendWork& w) { return w.io.step; })) {
    return absl::OkStatus();  // nothing to store
  }
  // Every item acts for the caller's tenant: charge it for all the pages.
  TenantUsage* usage = request.items_size() > 0 ? (*work)[0].seq->usage : nullptr;
  if (total_pages > 0) {
    if (absl::Status st = usage->ChargePages(total_pages); !st.ok()) return st;
  }
  // And for the bytes of the new pages and of the windows' growth.
  HeldBytes planned;
  for (int i = 0; i < request.items_size(); ++i) {
    const AttendWork& w = (*work)[i];
    if (w.io.step && w.plan.fresh > 0) planned += h_.AppendBytes(w.plan);
  }
  absl::StatusOr<ByteCharge> charge = ByteCharge::Take(usage, planned);
  if (!charge.ok()) {
    if (total_pages > 0) usage->RefundPages(total_pages);
    return charge.status();
  }
  // Pages of each device slot, all-or-nothing over the batch.
  std::vector<int64_t> need(h_.pool_->partitions(), 0);
  for (int i = 0; i < request.items_size(); ++i) {
    const AttendWork& w = (*work)[i];
    if (w.io.step) need[w.seq->device] += w.plan.pages;
  }
  std::vector<std::vector<PageId>> reserved(need.size());
  for (size_t k = 0; k < need.size(); ++k) {
    absl::StatusOr<std::vector<PageId>> r = h_.pool_->Reserve(need[k], static_cast<int>(k));
    if (!r.ok()) {
      for (size_t j = 0; j < k; ++j) h_.pool_->Free(reserved[j]);
      if (total_pages > 0) usage->RefundPages(total_pages);
      return r.status();
    }
    reserved[k] = *std::move(r);
  }
  std::vector<size_t> taken(need.size(), 0);
  // Every layer and sequence of the batch is locked: none may be demoted
  // to make room for a hot layer's new page.
  HotTier::Held held;
  const bool storing =
      std::any_of(work->begin(), work->end(), [](const AttendWork& w) { return w.io.step && w.plan.fresh > 0; });
  for (int i = 0; storing && i < request.items_size(); ++i) {
    held.sequences.insert((*work)[i].seq);
    held.layers.insert((*work)[i].layer->id);
  }
  // Each stepping item's pages, in item order.
  std::vector<std::vector<PageId>> pages(request.items_size());
  for (int i = 0; i < request.items_size(); ++i) {
    const AttendWork& w = (*work)[i];
    if (!w.io.step || w.plan.fresh == 0) continue;
    const std::vector<PageId>& mine = reserved[w.seq->device];
    size_t& at = taken[w.seq->device];
    pages[i].assign(mine.begin() + at, mine.begin() + at + w.plan.pages);
    at += w.plan.pages;
  }
  // The steps that seal pages are stored together (one encoding, one
  // promotion for the batch) when each is on a layer of its own; a layer
  // stepped twice in the batch takes its steps in order, one by one.
  bool together = std::any_of(work->begin(), work->begin() + request.items_size(),
                              [](const AttendWork& w) { return w.io.step && w.plan.pages > 0; });
  if (together) {  // one step in page_tokens: the others need no set
    absl::flat_hash_set<const LayerState*> stepped;
    for (int i = 0; i < request.items_size() && together; ++i) {
      const AttendWork& w = (*work)[i];
      if (w.io.step && w.plan.fresh > 0) together = stepped.insert(w.layer).second;
    }
  }
  std::vector<Sealing> sealing;
  std::vector<int> sealing_item;
  for (int i = 0; i < request.items_size() && together; ++i) {
    AttendWork& w = (*work)[i];
    if (!w.io.step || w.plan.pages == 0) continue;
    const v1::AttendItem& it = request.items(i);
    Sealing s;
    s.layer = w.layer;
    s.usage = w.seq->usage;
    s.name = LayerName{it.sequence_id(), static_cast<int>(it.layer())};
    s.plan = w.plan;
    s.tokens = StepTokens(w);
    s.pages = pages[i];
    sealing.push_back(std::move(s));
    sealing_item.push_back(i);
  }
  size_t sealed = 0;
  absl::Status st = h_.SealAppends(absl::MakeSpan(sealing), held, &sealed);
  // Items before the first that failed are stored; the others keep
  // nothing, their pages given back.
  const int failed = sealed < sealing.size() ? sealing_item[sealed] : request.items_size();
  if (!st.ok()) st = absl::Status(st.code(), absl::StrCat("items[", failed, "]: ", st.message()));
  HeldBytes applied;  // AppendBytes of the items stored
  std::vector<PageId> unstored;
  for (int i = 0; i < request.items_size(); ++i) {
    AttendWork& w = (*work)[i];
    const v1::AttendItem& it = request.items(i);
    if (i < failed && w.io.step && w.plan.fresh == 0) h_.metrics_->duplicate_tokens->Increment();  // a repeated step
    if (!w.io.step || w.plan.fresh == 0) continue;
    const bool done_together = together && w.plan.pages > 0;  // in `sealing`
    if (i >= failed) {
      unstored.insert(unstored.end(), pages[i].begin(), pages[i].end());
      continue;
    }
    if (!done_together) {
      absl::Status one =
          h_.ApplyAppend(w.layer, w.seq->usage, LayerName{it.sequence_id(), static_cast<int>(it.layer())}, w.plan,
                         StepTokens(w), pages[i], held);
      if (!one.ok()) {
        // Only a step that encodes can fail (and then not together).
        st = absl::Status(one.code(), absl::StrCat("items[", i, "]: ", one.message()));
        for (int j = i; j < request.items_size(); ++j)
          unstored.insert(unstored.end(), pages[j].begin(), pages[j].end());
        break;
      }
    }
    applied += h_.AppendBytes(w.plan);
    *used += pages[i].size();
    h_.totals_.tokens_ingested += 1;
    h_.totals_.bytes_ingested += 2 * h_.n() * DTypeBytes(it.dtype());
    h_.metrics_->ingested_tokens->Increment();
    h_.metrics_->ingested_bytes->Increment(2.0 * h_.n() * DTypeBytes(it.dtype()));
  }
  int64_t unused = static_cast<int64_t>(unstored.size());
  if (!unstored.empty()) h_.pool_->Free(unstored);
  for (size_t k = 0; k < reserved.size(); ++k) {
    if (taken[k] < reserved[k].size()) {
      unused += static_cast<int64_t>(reserved[k].size() - taken[k]);
      h_.pool_->Free(std::vector<PageId>(reserved[k].begin() + taken[k], reserved[k].end()));
    }
  }
  if (unused > 0) usage->RefundPages(unused);
  if (st.ok()) {
    charge->Keep();
  } else {
    // The items stored before the failure keep what they hold.
    *charge = ByteCharge();
    usage->AddBytes(applied);
  }
  return st;
}

absl::Status Handler::AttendBatch::Run(const v1::AttendRequest& request, v1::AttendResponse* response,
                                       const std::string& tenant, StagedOutputs* staged, AttendReuse* reuse) {
  const int items = request.items_size();
  if (items == 0) return absl::InvalidArgumentError("items is empty; send at least one item");
  if (items > h_.options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("items has ", items, " entries; max_batch is ", h_.options_.max_batch));
  }
  // 1. Validate every item before touching any state; tensors the device
  // reads in client memory are checked in one backend call.
  // What an earlier call of this request kept replaces the checks and
  // lookups of steps 1 and 2 while its regions and sequences last.
  std::vector<AttendWork>& work = ThreadItems(items);
  std::shared_ptr<Kept> kept = reuse != nullptr ? std::static_pointer_cast<Kept>(reuse->state_) : nullptr;
  if (kept != nullptr && !UseKept(*kept, tenant, &work)) {
    reuse->Clear();
    kept = nullptr;
  }
  if (kept == nullptr) {
    io_.StageInline(request);
    if (staged != nullptr) io_.LeaveStagedOutputs(staged);
    for (int i = 0; i < items; ++i) {
      absl::Status st = ValidateAttendItem(request.items(i), i, &work[i]);
      if (!st.ok()) return st;
    }
  }
  AttendPhaseClock::Mark(AttendPhase::kValidate);
  if (absl::Status st = io_.ReadClientTensors(); !st.ok()) return st;
  AttendPhaseClock::Mark(AttendPhase::kClientRead);
  // 2. Find the sequences; 3. the hot tier: promote the items' cold layers
  // (sync) or queue them (async), before any lock of the batch is held
  // (LOCK ORDER in handler.h); 4. lock them and their layers in order.
  AttendLocks fresh_locks;
  AttendLocks& locks = kept != nullptr ? kept->locks : fresh_locks;
  if (kept != nullptr) {
    for (int i = 0; i < items; ++i) {
      work[i].seq = locks.sequence(i).get();
      work[i].layer = &work[i].seq->layers[request.items(i).layer()];
    }
  } else if (absl::Status st = locks.Find(*h_.table_, request, tenant, &work); !st.ok()) {
    return st;
  }
  // Pages on a level below come back first, whole sequences, before any
  // lock is taken: the answer never comes from partial data.
  std::vector<SpillPin> pins;
  for (int i = 0; i < items && h_.spill_ != nullptr; ++i) {
    absl::Status st = h_.Resident(work[i].seq, request.items(i).sequence_id(), &pins);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("items[", i, "]: ", st.message()));
  }
  AttendPhaseClock::Mark(AttendPhase::kLookup);
  locks.Lock();
  if (kept != nullptr && locks.AnyReleased()) {
    // A kept sequence is gone: its id may name another one now. The full
    // path answers as for a request never kept.
    locks.Unlock();
    reuse->Clear();
    kept = nullptr;
    return Run(request, response, tenant, staged, nullptr);
  }
  bool promoted = false;  // the hot tier ran for this call: its gauges may move
  if (h_.hot_ != nullptr && AnyCold(work)) {
    // Promotion takes the layers' locks itself: the batch's go first.
    promoted = true;
    locks.Unlock();
    if (absl::Status st = PrepareHotTier(request, work, locks); !st.ok()) return st;
    locks.Lock();
  }
  AttendPhaseClock::Mark(AttendPhase::kHotTier);
  if (h_.options_.verify_pages_on_attend) {
    // Everything an item attends, against its checksums, before any
    // decode step is stored (a failure changes nothing) or any item is
    // attended: its pages in their tier as the backend holds them (the
    // device's copy on cuda) and its bf16 window. A step's own tokens are
    // checked as they leave the window (ApplyAppend). A layer of several
    // items is checked once.
    absl::flat_hash_set<const LayerState*> checked;
    for (int i = 0; i < items; ++i) {
      const LayerState& layer = *work[i].layer;
      if (!checked.insert(&layer).second) continue;
      const LayerName name{work[i].seq->id, static_cast<int>(request.items(i).layer())};
      absl::Status st = h_.verifier_->VerifyLayerPages(layer, PageVerifier::Copy::kBackend, name, kCheckAttend);
      if (st.ok()) {
        st = h_.verifier_->VerifyWindow(layer, 0, static_cast<int64_t>(layer.window_sums.size()), name, "served");
      }
      if (!st.ok()) {
        locks.Unlock();
        return absl::Status(st.code(), absl::StrCat("items[", i, "]: ", st.message()));
      }
    }
  }
  // 5. Plan every decode step on simulated lengths; 6. reserve all pages
  // at once, then apply the steps.
  int64_t total_pages = 0;
  size_t used = 0;
  absl::Status st = PlanAttendSteps(request, &work, &total_pages);
  if (st.ok()) st = ApplyAttendSteps(request, &work, total_pages, &used);
  if (!st.ok()) {
    locks.Unlock();
    if (total_pages > 0 || used > 0) h_.PublishGauges();
    return st;
  }

  // 7. Attention, every item at once.
  const int d = h_.codec_->head_dim();
  std::vector<AttendJob> jobs(items);
  response->clear_results();
  response->mutable_results()->Reserve(items);
  uint64_t attended = 0;
  bool any_step = false;
  for (int i = 0; i < items; ++i) {
    const v1::AttendItem& it = request.items(i);
    const LayerState& layer = *work[i].layer;
    v1::AttendResult* r = response->add_results();
    AttendJob& j = jobs[i];
    handler_internal::SetLayerTokens(layer, h_.n(), h_.pool_->page_tokens(), &j);
    j.q_heads = static_cast<int>(it.q_heads());
    j.softmax_scale = work[i].scale;
    j.layer = static_cast<int>(it.layer());
    j.hot = layer.hot;
    io_.Bind(&work[i].io, static_cast<size_t>(it.q_heads()) * d, j.q_heads, &j, r);
    r->set_tokens(layer.length);
    r->set_compressed_tokens(layer.pages.size() * h_.pool_->page_tokens());
    attended += layer.length;
    any_step = any_step || work[i].io.step;
  }
  AttendPhaseClock::Mark(AttendPhase::kState);
  h_.backend_->Attend(absl::MakeSpan(jobs));
  AttendPhaseClock::Mark(AttendPhase::kBackendHost);
  locks.TouchAll(*h_.table_);
  if (h_.hot_ != nullptr) {
    // Hot layers cannot be demoted while read-locked: their entries exist.
    absl::InlinedVector<uint64_t, 64> hot;
    for (int i = 0; i < items; ++i) {
      if (work[i].layer->hot) hot.push_back(work[i].layer->id);
    }
    h_.hot_->Touch(absl::MakeConstSpan(hot), h_.hot_->NowNs());
  }
  locks.Unlock();
  for (int i = 0; i < items; ++i) {
    if (!jobs[i].status.ok()) {
      return absl::Status(jobs[i].status.code(), absl::StrCat("items[", i, "]: ", jobs[i].status.message()));
    }
    if (absl::Status st = io_.CheckQuery(i, work[i].io, jobs[i]); !st.ok()) return st;
    io_.Finish(&work[i].io, i, static_cast<size_t>(request.items(i).q_heads()) * d, jobs[i].q_heads,
               response->mutable_results(i));
  }
  io_.HandOverStaging();
  h_.totals_.attention_tokens += attended;
  h_.metrics_->attention_tokens->Increment(static_cast<double>(attended));
  h_.metrics_->attention_items->Increment(items);
  {
    int by_route[static_cast<int>(AttendRoute::kCount)] = {};
    for (int i = 0; i < items; ++i) ++by_route[static_cast<int>(jobs[i].route)];
    for (int k = 1; k < static_cast<int>(AttendRoute::kCount); ++k) {
      if (by_route[k] > 0) h_.metrics_->attention_items_by_route[k]->Increment(by_route[k]);
    }
  }
  // Gauges move when pages or windows changed, or the hot tier may have
  // promoted this call's layers (moves of its own thread publish their
  // own).
  if (total_pages > 0 || used > 0 || any_step || promoted) h_.PublishGauges();
  if (reuse != nullptr && kept == nullptr) reuse->state_ = Keep(work, tenant, &fresh_locks);
  return absl::OkStatus();
}

}  // namespace driftkv
