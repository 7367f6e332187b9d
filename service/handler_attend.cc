// Handler::Attend: validates every item, locks the sequences and layers in
// order, applies the decode steps all-or-nothing, then runs every item as
// one backend call.
#include "service/handler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler_internal.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::kMaxTokenIndex;
using handler_internal::Quoted;

// One Attend call in steps: validate, bring the layers to the hot tier,
// lock, plan and apply the decode steps, attend.
class Handler::AttendBatch {
 public:
  // One item of an Attend request, validated and decoded.
  struct AttendWork {
    // The query: f32 bytes of the request used in place when aligned (the
    // request outlives the call), else converted into `converted`.
    const float* query = nullptr;
    std::vector<float> converted;
    std::vector<float> key, value;  // the decode step's token
    bool step = false;                     // the item appends a token first
    float scale = 0.0f;
    Sequence* seq = nullptr;
    AppendPlan plan;
  };

  // The locks of one Attend batch, taken in the order of handler.h: every
  // sequence (readers, id order), then every layer ((id, layer) order;
  // writers where a decode step appends).
  class AttendLocks {
   public:
    // Finds the items' sequences; NOT_FOUND naming the first missing one.
    absl::Status Find(const SequenceTable& table, const v1::AttendRequest& request, const std::string& tenant,
                      std::vector<AttendWork>* work) {
      for (int i = 0; i < request.items_size(); ++i) {
        auto& entry = seqs_[request.items(i).sequence_id()];
        if (entry.first == nullptr) {
          entry.first = table.Find(TenantKey(tenant, request.items(i).sequence_id()));
          if (entry.first == nullptr) {
            return absl::NotFoundError(absl::StrCat("items[", i, "].sequence_id ",
                                                    Quoted(request.items(i).sequence_id()), " not found"));
          }
        }
        entry.second = entry.second || (*work)[i].step;
        (*work)[i].seq = entry.first.get();
      }
      for (int i = 0; i < request.items_size(); ++i) {
        const v1::AttendItem& it = request.items(i);
        auto& entry = layers_[{it.sequence_id(), it.layer()}];
        entry.first = &(*work)[i].seq->layers[it.layer()];
        entry.second = entry.second || (*work)[i].step;
      }
      return absl::OkStatus();
    }
    void Lock() {
      for (auto& [id, entry] : seqs_) entry.first->mu.ReaderLock();
      for (auto& [key, entry] : layers_) {
        if (entry.second) {
          entry.first->mu.Lock();
        } else {
          entry.first->mu.ReaderLock();
        }
      }
    }
    void Unlock() {
      for (auto& [key, entry] : layers_) {
        if (entry.second) {
          entry.first->mu.Unlock();
        } else {
          entry.first->mu.ReaderUnlock();
        }
      }
      for (auto& [id, entry] : seqs_) entry.first->mu.ReaderUnlock();
      layers_.clear();  // seqs_ keeps the sequences alive until the call returns
    }
    void TouchAll(const SequenceTable& table) {
      for (auto& [id, entry] : seqs_) table.Touch(entry.first.get());
    }

   private:
    std::map<std::string, std::pair<SequencePtr, bool>> seqs_;                // sequence, any step
    std::map<std::pair<std::string, uint32_t>, std::pair<LayerState*, bool>> layers_;  // layer, any step
  };

  explicit AttendBatch(Handler& h) : h_(h) {}
  absl::Status Run(const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant);

 private:
  // Before the batch's locks: promotes (sync) or queues (async) the
  // items' cold layers (HotTier::Prepare). REQUIRES: h_.hot_ set.
  void PrepareHotTier(const v1::AttendRequest& request, const std::string& tenant);
  absl::Status ValidateAttendItem(const v1::AttendItem& item, int index, AttendWork* work) const;
  // REQUIRES: the batch's locks held (AttendLocks).
  absl::Status PlanAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                               int64_t* total_pages) const;
  // Reserves total_pages pages, applies the planned steps; *used: pages
  // stored (the rest are freed). REQUIRES: the batch's locks held.
  absl::Status ApplyAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                                int64_t total_pages, size_t* used);

  Handler& h_;
};

absl::Status Handler::Attend(const v1::AttendRequest& request, v1::AttendResponse* response,
                             const std::string& tenant) {
  absl::Status st = AttendBatch(*this).Run(request, response, tenant);
  if (!st.ok()) metrics_->rejected_chunks->Increment();
  return st;
}

void Handler::AttendBatch::PrepareHotTier(const v1::AttendRequest& request, const std::string& tenant) {
  // The request's layers, each once; they are never demoted to make room
  // for each other.
  std::vector<std::pair<SequencePtr, int>> layers;
  absl::flat_hash_set<uint64_t> ids;
  for (const v1::AttendItem& it : request.items()) {
    SequencePtr seq = h_.table_->Find(TenantKey(tenant, it.sequence_id()));
    if (seq == nullptr) continue;  // the locking step reports it
    if (ids.insert(seq->layers[it.layer()].id).second) layers.emplace_back(std::move(seq), it.layer());
  }
  h_.hot_->Prepare(layers, ids);
}

absl::Status Handler::AttendBatch::ValidateAttendItem(const v1::AttendItem& it, int i, AttendWork* w) const {
  const int d = h_.codec_->head_dim(), kv_heads = h_.codec_->kv_heads();
  const std::string where = absl::StrCat("items[", i, "]");
  absl::Status st = h_.CheckSequenceId(where + ".sequence_id", it.sequence_id());
  if (st.ok()) st = h_.CheckLayer(where + ".layer", it.layer());
  if (st.ok() && it.has_head_dim() && it.head_dim() != static_cast<uint32_t>(d)) {
    st = absl::InvalidArgumentError(
        absl::StrCat(where, ".head_dim ", it.head_dim(), " does not match the server's head_dim ", d));
  }
  if (st.ok() && (it.q_heads() == 0 || it.q_heads() % kv_heads != 0)) {
    st = absl::InvalidArgumentError(absl::StrCat(where, ".q_heads ", it.q_heads(),
                                                 " is not a positive multiple of kv_heads ", kv_heads));
  }
  if (st.ok() && it.q_heads() > 65536) {
    st = absl::InvalidArgumentError(absl::StrCat(where, ".q_heads ", it.q_heads(), " exceeds 65536"));
  }
  const size_t qe = static_cast<size_t>(it.q_heads()) * d;
  if (st.ok()) {
    st = CheckTensorBytes(where + ".query", it.dtype(), it.query().size(), qe,
                          absl::StrCat("q_heads ", it.q_heads(), " x head_dim ", d));
  }
  if (st.ok()) {
    if (it.dtype() == v1::DTYPE_F32 && reinterpret_cast<uintptr_t>(it.query().data()) % alignof(float) == 0) {
      w->query = reinterpret_cast<const float*>(it.query().data());
    } else {
      w->converted.resize(qe);
      TensorToFloat(it.query(), it.dtype(), qe, w->converted.data());
      w->query = w->converted.data();
    }
    st = CheckValues(where + ".query", w->query, qe, std::numeric_limits<float>::max());
  }
  w->step = !it.new_key().empty() || !it.new_value().empty();
  if (st.ok() && w->step) {
    const std::string shape = absl::StrCat("1 token x kv_heads ", kv_heads, " x head_dim ", d);
    st = CheckTensorBytes(where + ".new_key", it.dtype(), it.new_key().size(), h_.n(), shape);
    if (st.ok()) st = CheckTensorBytes(where + ".new_value", it.dtype(), it.new_value().size(), h_.n(), shape);
    if (st.ok()) {
      w->key.resize(h_.n());
      w->value.resize(h_.n());
      TensorToFloat(it.new_key(), it.dtype(), h_.n(), w->key.data());
      TensorToFloat(it.new_value(), it.dtype(), h_.n(), w->value.data());
      st = CheckValues(where + ".new_key", w->key.data(), h_.n(), h_.value_limit());
      if (st.ok()) st = CheckValues(where + ".new_value", w->value.data(), h_.n(), h_.value_limit());
    }
  }
  if (st.ok() && !w->step && it.has_new_token_index()) {
    st = absl::InvalidArgumentError(absl::StrCat(
        where, ".new_token_index ", it.new_token_index(), " is set but new_key/new_value are empty"));
  }
  if (st.ok() && it.has_new_token_index() && it.new_token_index() > kMaxTokenIndex) {
    st = absl::InvalidArgumentError(
        absl::StrCat(where, ".new_token_index ", it.new_token_index(), " exceeds ", kMaxTokenIndex));
  }
  w->scale = it.has_softmax_scale() ? it.softmax_scale() : 1.0f / std::sqrt(static_cast<float>(d));
  if (st.ok() && !(std::isfinite(w->scale) && w->scale > 0.0f)) {
    st = absl::InvalidArgumentError(absl::StrCat(where, ".softmax_scale ", w->scale, " must be finite and > 0"));
  }
  return st;
}

absl::Status Handler::AttendBatch::PlanAttendSteps(const v1::AttendRequest& request, std::vector<AttendWork>* work,
                                      int64_t* total_pages) const {
  // Simulated (length, window) per layer: items of one batch may share a layer.
  std::map<std::pair<Sequence*, uint32_t>, std::pair<int64_t, int64_t>> sim;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::AttendItem& it = request.items(i);
    AttendWork& w = (*work)[i];
    if (w.seq->released) {
      return absl::NotFoundError(
          absl::StrCat("items[", i, "].sequence_id ", Quoted(it.sequence_id()), " not found (released)"));
    }
    const LayerState& layer = w.seq->layers[it.layer()];
    auto key = std::make_pair(w.seq, it.layer());
    auto found = sim.find(key);
    if (found == sim.end()) {
      found = sim.emplace(key, std::make_pair(layer.length, static_cast<int64_t>(layer.window_keys.size() / h_.n())))
                  .first;
    }
    auto& [length, window] = found->second;
    if (w.step) {
      const uint64_t first = it.has_new_token_index() ? it.new_token_index() : length;
      absl::StatusOr<AppendPlan> plan = h_.PlanAppend(length, window, absl::StrCat("items[", i, "].new_token_index"),
                                                   it.sequence_id(), it.layer(), first, 1);
      if (!plan.ok()) return plan.status();
      w.plan = *plan;
      // A repeated step (new_token_index below the length) must carry the
      // stored token. Checked against the layer as it was before this
      // batch: a token planned by an earlier item of the batch is not
      // stored yet, and such a repeat is acknowledged as before.
      if (plan->skip > 0 && static_cast<int64_t>(first) < layer.length) {
        absl::Status st = h_.CheckRepeat(layer, first, 1, w.key.data(), w.value.data(),
                                      absl::StrCat("items[", i, "].new_key/new_value"), it.sequence_id(), it.layer());
        if (!st.ok()) return st;
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
  // Every item acts for the caller's tenant: charge it for all the pages.
  TenantUsage* usage = request.items_size() > 0 ? (*work)[0].seq->usage : nullptr;
  if (total_pages > 0) {
    if (absl::Status st = usage->ChargePages(total_pages); !st.ok()) return st;
  }
  // Pages of each device slot, all-or-nothing over the batch.
  std::vector<int64_t> need(h_.pool_->partitions(), 0);
  for (int i = 0; i < request.items_size(); ++i) {
    const AttendWork& w = (*work)[i];
    if (w.step) need[w.seq->device] += w.plan.pages;
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
  for (int i = 0; i < request.items_size(); ++i) {
    held.sequences.insert((*work)[i].seq);
    held.layers.insert((*work)[i].seq->layers[request.items(i).layer()].id);
  }
  absl::Status st;
  for (int i = 0; i < request.items_size() && st.ok(); ++i) {
    AttendWork& w = (*work)[i];
    const v1::AttendItem& it = request.items(i);
    if (w.step && w.plan.fresh == 0) h_.metrics_->duplicate_tokens->Increment();  // a repeated step
    if (!w.step || w.plan.fresh == 0) continue;
    const std::vector<PageId>& mine = reserved[w.seq->device];
    size_t& at = taken[w.seq->device];
    std::vector<PageId> pages(mine.begin() + at, mine.begin() + at + w.plan.pages);
    st = h_.ApplyAppend(&w.seq->layers[it.layer()], static_cast<int>(it.layer()), w.plan, w.key.data(), w.value.data(),
                     pages, held);
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("items[", i, "]: ", st.message()));
      break;
    }
    *used += pages.size();
    at += pages.size();
    h_.totals_.tokens_ingested += 1;
    h_.totals_.bytes_ingested += 2 * h_.n() * DTypeBytes(it.dtype());
    h_.metrics_->ingested_tokens->Increment();
    h_.metrics_->ingested_bytes->Increment(2.0 * h_.n() * DTypeBytes(it.dtype()));
  }
  int64_t unused = 0;
  for (size_t k = 0; k < reserved.size(); ++k) {
    if (taken[k] < reserved[k].size()) {
      unused += static_cast<int64_t>(reserved[k].size() - taken[k]);
      h_.pool_->Free(std::vector<PageId>(reserved[k].begin() + taken[k], reserved[k].end()));
    }
  }
  if (unused > 0) usage->RefundPages(unused);
  return st;
}

absl::Status Handler::AttendBatch::Run(const v1::AttendRequest& request, v1::AttendResponse* response,
                                 const std::string& tenant) {
  const int items = request.items_size();
  if (items == 0) return absl::InvalidArgumentError("items is empty; send at least one item");
  if (items > h_.options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("items has ", items, " entries; max_batch is ", h_.options_.max_batch));
  }
  // 1. Validate every item before touching any state.
  std::vector<AttendWork> work(items);
  for (int i = 0; i < items; ++i) {
    absl::Status st = ValidateAttendItem(request.items(i), i, &work[i]);
    if (!st.ok()) return st;
  }
  // 2. The hot tier: promote the items' cold layers (sync) or queue them
  // (async), before any lock of the batch is held (HOT TIER in handler.h).
  if (h_.hot_ != nullptr) PrepareHotTier(request, tenant);
  // 3. Find the sequences and lock them and their layers in order.
  AttendLocks locks;
  if (absl::Status st = locks.Find(*h_.table_, request, tenant, &work); !st.ok()) return st;
  locks.Lock();
  // 4. Plan every decode step on simulated lengths; 5. reserve all pages
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

  // 6. Attention, every item at once.
  const int d = h_.codec_->head_dim();
  std::vector<AttendJob> jobs(items);
  response->clear_results();
  std::vector<std::vector<float>> lse(items);
  uint64_t attended = 0;
  for (int i = 0; i < items; ++i) {
    const v1::AttendItem& it = request.items(i);
    const LayerState& layer = work[i].seq->layers[it.layer()];
    v1::AttendResult* r = response->add_results();
    r->mutable_output()->resize(static_cast<size_t>(it.q_heads()) * d * sizeof(float));
    lse[i].resize(it.q_heads());
    AttendJob& j = jobs[i];
    j.pages = absl::MakeConstSpan(layer.pages);
    j.window = Bf16Tokens{layer.window_keys.data(), layer.window_values.data(),
                          static_cast<int64_t>(layer.window_keys.size() / h_.n())};
    j.window_id = layer.id;
    j.window_first = static_cast<int64_t>(layer.pages.size()) * h_.pool_->page_tokens();
    j.query = work[i].query;
    j.q_heads = static_cast<int>(it.q_heads());
    j.softmax_scale = work[i].scale;
    j.layer = static_cast<int>(it.layer());
    j.hot = layer.hot;
    j.out = reinterpret_cast<float*>(r->mutable_output()->data());
    j.lse = lse[i].data();
    r->set_tokens(layer.length);
    r->set_compressed_tokens(layer.pages.size() * h_.pool_->page_tokens());
    attended += layer.length;
  }
  if (h_.options_.verify_pages_on_attend) {
    // Each cold page against its checksum before it is attended (hot
    // pages: backends/page_checksum.h, "What it covers").
    for (int i = 0; i < items; ++i) {
      const LayerState& layer = work[i].seq->layers[request.items(i).layer()];
      if (layer.hot) continue;
      for (size_t k = 0; k < layer.pages.size(); ++k) {
        absl::Status st = h_.verifier_->Verify(layer, k, layer.pages[k], work[i].seq->id,
                                         static_cast<int>(request.items(i).layer()), kCheckAttend);
        if (!st.ok()) {
          locks.Unlock();
          return absl::Status(st.code(), absl::StrCat("items[", i, "]: ", st.message()));
        }
      }
    }
  }
  h_.backend_->Attend(absl::MakeSpan(jobs));
  locks.TouchAll(*h_.table_);
  if (h_.hot_ != nullptr) {
    // Hot layers cannot be demoted while read-locked: their entries exist.
    const int64_t now = h_.hot_->NowNs();
    for (int i = 0; i < items; ++i) {
      const LayerState& layer = work[i].seq->layers[request.items(i).layer()];
      if (layer.hot) h_.hot_->Touch(layer.id, now);
    }
  }
  locks.Unlock();
  for (int i = 0; i < items; ++i) {
    if (!jobs[i].status.ok()) {
      return absl::Status(jobs[i].status.code(), absl::StrCat("items[", i, "]: ", jobs[i].status.message()));
    }
    response->mutable_results(i)->mutable_lse()->Assign(lse[i].begin(), lse[i].end());
  }
  h_.totals_.attention_tokens += attended;
  h_.metrics_->attention_tokens->Increment(static_cast<double>(attended));
  h_.metrics_->attention_items->Increment(items);
  if (total_pages > 0 || used > 0 || h_.hot_ != nullptr ||
      std::any_of(work.begin(), work.end(), [](const AttendWork& w) { return w.step; })) {
    h_.PublishGauges();
  }
  return absl::OkStatus();
}

}  // namespace driftkv
