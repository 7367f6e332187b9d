// Handler::Append: plans a chunk on a layer, reserves its pages
// all-or-nothing and stores it (also the decode steps of Attend).
#include "service/handler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/handler_internal.h"
#include "service/token_digest.h"
#include "service/token_ids.h"
#include "wire/crc32c.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::kMaxTokenIndex;
using handler_internal::Quoted;

absl::StatusOr<Handler::AppendPlan> Handler::PlanAppend(int64_t length, int64_t window, absl::string_view where,
                                                        const std::string& id, uint32_t layer, uint64_t first,
                                                        int64_t count) const {
  if (first > static_cast<uint64_t>(length)) {
    return absl::OutOfRangeError(absl::StrCat(where, " ", first, " leaves a gap: layer ", layer, " of sequence_id ",
                                              Quoted(id), " holds ", length, " tokens, so the next token is ", length));
  }
  AppendPlan plan;
  const int64_t f = static_cast<int64_t>(first);
  if (f + count <= length) {
    plan.skip = count;
    return plan;
  }
  plan.skip = length - f;
  plan.fresh = count - plan.skip;
  const int64_t r = options_.window_tokens, p = pool_->page_tokens();
  const int64_t total = window + plan.fresh;
  plan.pages = total >= r + p ? (total - r) / p : 0;
  return plan;
}

void Handler::RecordEncoded(absl::Span<const EncodeJob> jobs) {
  absl::MutexLock lock(&totals_.codec_mu);
  for (const EncodeJob& j : jobs) {
    metrics_->RecordPage(j.stats, j.key_utilization, j.value_utilization);
    totals_.codec.Add(j.stats);
  }
}

HeldBytes Handler::AppendBytes(const AppendPlan& plan) const {
  HeldBytes b;
  b.cold_pages = plan.pages * static_cast<int64_t>(pool_->page_stride());
  b.windows = (plan.fresh - plan.pages * pool_->page_tokens()) * WindowBytesPerToken(n());
  return b;
}

void Handler::HostTokens::CopyBf16(size_t first, size_t count, uint16_t* k, uint16_t* v) const {
  if (keys_bf16 != nullptr) {
    std::memcpy(k, keys_bf16 + first, count * sizeof(uint16_t));
    std::memcpy(v, values_bf16 + first, count * sizeof(uint16_t));
    return;
  }
  FloatsToBf16(keys + first, count, k);
  FloatsToBf16(values + first, count, v);
}

absl::Status Handler::CheckHeader(const std::string& sequence_id, uint32_t layer, uint64_t first_token,
                                  uint32_t token_count, const uint32_t* kv_heads, const uint32_t* head_dim) const {
  absl::Status st = CheckSequenceId("sequence_id", sequence_id);
  if (st.ok()) st = CheckLayer("layer", layer);
  if (st.ok() && token_count == 0) st = absl::InvalidArgumentError("token_count 0 must be >= 1");
  if (st.ok() && first_token > kMaxTokenIndex) {
    st = absl::InvalidArgumentError(absl::StrCat("first_token ", first_token, " exceeds ", kMaxTokenIndex));
  }
  // The optional shape fields, before the byte counts (which cannot tell
  // 8 heads x 64 from 4 x 128).
  if (st.ok() && kv_heads != nullptr && *kv_heads != static_cast<uint32_t>(codec_->kv_heads())) {
    st = absl::InvalidArgumentError(
        absl::StrCat("kv_heads ", *kv_heads, " does not match the server's kv_heads ", codec_->kv_heads()));
  }
  if (st.ok() && head_dim != nullptr && *head_dim != static_cast<uint32_t>(codec_->head_dim())) {
    st = absl::InvalidArgumentError(
        absl::StrCat("head_dim ", *head_dim, " does not match the server's head_dim ", codec_->head_dim()));
  }
  return st;
}

namespace {

std::string ShapeOf(uint32_t count, int kv_heads, int head_dim) {
  return absl::StrCat("token_count ", count, " x kv_heads ", kv_heads, " x head_dim ", head_dim);
}

// AppendChunk.token_ids: none, or one per token.
absl::Status CheckTokenIdCount(const v1::AppendChunk& c) {
  if (c.token_ids().empty() || static_cast<uint32_t>(c.token_ids_size()) == c.token_count()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("token_ids has ", c.token_ids_size(), " ids; token_count ",
                                                 c.token_count(), " needs one per token (or none)"));
}

}  // namespace

absl::Status Handler::Append(const v1::AppendChunk& c, v1::AppendResponse* totals, const std::string& tenant) {
  if (c.has_keys_ref() || c.has_values_ref()) {
    // By reference: the chunk's header as a PushChunk's.
    absl::Status st;
    if (!c.keys().empty() || !c.values().empty()) {
      st = absl::InvalidArgumentError("keys/values and keys_ref/values_ref are both set; send one or the other");
    } else if (c.has_crc32c()) {
      st = absl::InvalidArgumentError("crc32c covers inline keys and values; leave it unset with keys_ref/values_ref");
    }
    if (!st.ok()) {
      metrics_->rejected_chunks->Increment();
      return st;
    }
    v1::PushChunkRequest h;
    h.set_sequence_id(c.sequence_id());
    h.set_layer(c.layer());
    h.set_first_token(c.first_token());
    h.set_token_count(c.token_count());
    h.set_dtype(c.dtype());
    h.set_tensor_bytes(static_cast<uint64_t>(c.token_count()) * n() * DTypeBytes(c.dtype()));
    if (c.has_kv_heads()) h.set_kv_heads(c.kv_heads());
    if (c.has_head_dim()) h.set_head_dim(c.head_dim());
    h.set_new_incarnation(c.new_incarnation());
    if (c.has_keys_ref()) *h.mutable_keys_ref() = c.keys_ref();
    if (c.has_values_ref()) *h.mutable_values_ref() = c.values_ref();
    if (absl::Status ids = CheckTokenIdCount(c); !ids.ok()) {
      metrics_->rejected_chunks->Increment();
      return ids;
    }
    return AppendReferenced(h, totals, tenant, c.token_ids());
  }
  const uint32_t kv_heads = c.kv_heads(), head_dim = c.head_dim();
  absl::Status st = CheckHeader(c.sequence_id(), c.layer(), c.first_token(), c.token_count(),
                                c.has_kv_heads() ? &kv_heads : nullptr, c.has_head_dim() ? &head_dim : nullptr);
  const size_t elements = static_cast<size_t>(c.token_count()) * n();
  const std::string shape = ShapeOf(c.token_count(), codec_->kv_heads(), codec_->head_dim());
  if (st.ok()) st = CheckTokenIdCount(c);
  if (st.ok()) st = CheckTensorBytes("keys", c.dtype(), c.keys().size(), elements, shape);
  if (st.ok()) st = CheckTensorBytes("values", c.dtype(), c.values().size(), elements, shape);
  if (st.ok() && c.has_crc32c()) {
    const uint32_t crc = Crc32cExtend(Crc32c(c.keys()), c.values().data(), c.values().size());
    if (crc != c.crc32c()) {
      metrics_->integrity_rejections[kRejectCrc32c]->Increment();
      st = absl::DataLossError(absl::StrFormat(
          "crc32c 0x%08x does not match the chunk's keys+values bytes (0x%08x over %d bytes): corrupted in "
          "transit or by the sender; nothing stored",
          c.crc32c(), crc, c.keys().size() + c.values().size()));
    }
  }
  std::vector<float> keys, values;
  if (st.ok()) {
    keys.resize(elements);
    values.resize(elements);
    TensorToFloat(c.keys(), c.dtype(), elements, keys.data());
    TensorToFloat(c.values(), c.dtype(), elements, values.data());
    st = CheckValues("keys", keys.data(), elements, value_limit());
    if (st.ok()) st = CheckValues("values", values.data(), elements, value_limit());
  }
  if (!st.ok()) {
    metrics_->rejected_chunks->Increment();
    return st;
  }
  return StoreChunk(tenant, c.sequence_id(), c.new_incarnation(), c.layer(), c.first_token(), c.token_count(),
                    c.dtype(), keys.data(), values.data(), nullptr, totals, c.token_ids());
}

absl::Status Handler::CheckChunkHeader(const v1::PushChunkRequest& h) const {
  const uint32_t kv_heads = h.kv_heads(), head_dim = h.head_dim();
  absl::Status st = CheckHeader(h.sequence_id(), h.layer(), h.first_token(), h.token_count(),
                                h.has_kv_heads() ? &kv_heads : nullptr, h.has_head_dim() ? &head_dim : nullptr);
  const size_t elements = static_cast<size_t>(h.token_count()) * n();
  const std::string shape = ShapeOf(h.token_count(), codec_->kv_heads(), codec_->head_dim());
  if (st.ok()) st = CheckTensorBytes("keys", h.dtype(), h.tensor_bytes(), elements, shape);
  return st;
}

absl::Status Handler::AppendStaged(const v1::PushChunkRequest& h, const StagedTokens& t, v1::AppendResponse* totals,
                                   const std::string& tenant, absl::Span<const uint32_t> token_ids) {
  absl::Status st = CheckChunkHeader(h);
  if (st.ok() && (t.tokens != h.token_count() || t.dtype != h.dtype())) {
    st = absl::InternalError("staged tokens do not match the chunk header");
  }
  if (st.ok()) st = backend_->CheckStaged(t, n(), value_limit());
  if (!st.ok()) {
    metrics_->rejected_chunks->Increment();
    return st;
  }
  return StoreChunk(tenant, h.sequence_id(), h.new_incarnation(), h.layer(), h.first_token(), h.token_count(),
                    h.dtype(), nullptr, nullptr, &t, totals, token_ids);
}

absl::Status Handler::StoreChunk(const std::string& tenant, const std::string& sequence_id, bool new_incarnation,
                                 uint32_t layer_index, uint64_t first_token, uint32_t token_count, int dtype,
                                 const float* keys, const float* values, const StagedTokens* staged,
                                 v1::AppendResponse* totals, absl::Span<const uint32_t> token_ids) {
  absl::Status st;
  const std::string key = TenantKey(tenant, sequence_id);
  // A released id is tombstoned: only a new incarnation may reuse it (a
  // live sequence under the id is one already, and takes the chunk).
  // (FindOrCreate checks it again where it decides, under the table lock.)
  if (!new_incarnation && table_->Find(key) == nullptr) {
    if (absl::Status tomb = table_->CheckTombstone(key, sequence_id); !tomb.ok()) {
      metrics_->rejected_chunks->Increment();
      return tomb;
    }
  }
  if (first_token != 0 && table_->Find(key) == nullptr) {
    metrics_->rejected_chunks->Increment();
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(sequence_id),
                                            " not found (a new sequence starts at first_token 0, got ", first_token,
                                            ")"));
  }
  std::vector<SpillPin> pins;  // the levels below': new pages go after pages in the pool
  for (int attempt = 0;; ++attempt) {
    bool created = false;
    absl::StatusOr<SequencePtr> found = table_->FindOrCreate(key, sequence_id, tenant, new_incarnation, &created);
    if (!found.ok()) {
      metrics_->rejected_chunks->Increment();
      return found.status();
    }
    Sequence* seq = found->get();
    if (absl::Status below = Resident(seq, sequence_id, &pins); !below.ok()) {
      metrics_->rejected_chunks->Increment();
      return below;
    }
    AppendPlan plan;
    {
      absl::ReaderMutexLock seq_lock(&seq->mu);
      if (seq->released) {
        // Released between lookup and lock: retry, which meets the
        // tombstone (or, with new_incarnation, starts a new sequence).
        if (attempt < 3) continue;
        return absl::AbortedError(
            absl::StrCat("sequence_id ", Quoted(sequence_id), " was released while appending; retry"));
      }
      LayerState& layer = seq->layers[layer_index];
      absl::MutexLock layer_lock(&layer.mu);
      absl::StatusOr<AppendPlan> planned =
          PlanAppend(layer.length, static_cast<int64_t>(layer.window_keys.size() / n()), "first_token", sequence_id,
                     layer_index, first_token, token_count);
      st = planned.status();
      std::vector<PageId> pages;
      if (st.ok()) {
        plan = *planned;
        if (plan.skip > 0)
          st = CheckRepeatChunk(layer, first_token, plan.skip, keys, values, staged, sequence_id, layer_index);
      }
      // The token ids, after every other check of the chunk's content;
      // undone below if the chunk is refused after all.
      TokenIdsChange ids_change;
      bool ids_changed = false;
      std::vector<PageKey> new_keys;   // of the layer's pages this chunk seals, as far as known
      PageKey parent = PageKeyRoot();  // of new_keys[0]
      SealedPages sealed;
      if (st.ok()) {
        absl::MutexLock ids_lock(&seq->token_ids.mu);
        st = AcceptTokenIds(&seq->token_ids, first_token, token_count, token_ids, plan.fresh > 0, pool_->page_tokens(),
                            sequence_id, layer_index, &ids_change);
        ids_changed = st.ok();
        const size_t first_page = layer.pages.size();
        const size_t known = seq->token_ids.keys.size();
        if (first_page > 0 && first_page <= known) parent = seq->token_ids.keys[first_page - 1];
        for (size_t k = first_page; k < first_page + plan.pages && k < known; ++k) {
          new_keys.push_back(seq->token_ids.keys[k]);
        }
        sealed.keyed = static_cast<int64_t>(new_keys.size());
      }
      // The tenant's quotas, before any memory is taken: the pages, and
      // the bytes of the new pages and of the window's growth (less the
      // tokens the pages take out of it).
      bool charged = false;
      if (st.ok() && plan.pages > 0) {
        st = seq->usage->ChargePages(plan.pages);
        charged = st.ok();
      }
      ByteCharge bytes;
      if (st.ok()) {
        absl::StatusOr<ByteCharge> taken = ByteCharge::Take(seq->usage, AppendBytes(plan));
        st = taken.status();
        if (st.ok()) bytes = *std::move(taken);
      }
      if (st.ok()) {
        absl::StatusOr<std::vector<PageId>> reserved = pool_->Reserve(plan.pages, seq->device);
        st = reserved.status();
        if (st.ok()) pages = *std::move(reserved);
      }
      if (st.ok()) {
        HotTier::Held held;
        held.sequences.insert(seq);
        st = ApplyAppend(&layer, seq->usage, LayerName{sequence_id, static_cast<int>(layer_index)}, plan,
                         HostTokens{keys, values}, pages, held, staged, &sealed);
        if (!st.ok()) pool_->Free(pages);
      }
      if (!st.ok() && charged) seq->usage->RefundPages(plan.pages);
      if (!st.ok() && ids_changed) {
        absl::MutexLock ids_lock(&seq->token_ids.mu);
        UndoTokenIds(&seq->token_ids, ids_change);
      }
      if (st.ok()) {
        bytes.Keep();
        table_->Touch(seq);
        // A chunk of several tokens (a prefill's) puts the layer's bf16
        // window on a device that keeps windows now, while its tokens are
        // at hand, so the sequence's first Attend uploads none; a decode
        // step's single token goes up inside its Attend's launch instead,
        // which costs no round trip of its own. Best effort: a window that
        // does not go up now goes with that Attend, which also meets any
        // device error first.
        if (plan.fresh > 1 && !layer.window_keys.empty()) {
          AttendJob job;
          handler_internal::SetLayerTokens(layer, n(), pool_->page_tokens(), &job);
          backend_->CacheWindows(absl::MakeConstSpan(&job, 1)).IgnoreError();
        }
        if (!sealed.pages.empty() || ids_change.closed_now) {
          const PageKey ns = NamespaceOf(tenant);
          if (ids_change.closed_now) index_->MarkUnhashed(ns, ids_change.unhashed_after);
          if (!sealed.pages.empty()) {
            index_->Insert(ns, static_cast<int>(layer_index), parent, new_keys, std::move(sealed.pages));
          }
        }
      }
    }
    if (!st.ok()) {
      metrics_->rejected_chunks->Increment();
      if (created) table_->DropIfEmpty(*found);
      PublishGauges();
      return st;
    }
    if (created) {
      metrics_->sequences_created->Increment();
      if (new_incarnation) table_->EraseTombstone(key);
    }
    const uint64_t raw_bytes = 2 * plan.fresh * n() * DTypeBytes(dtype);
    totals_.tokens_ingested += plan.fresh;
    totals_.bytes_ingested += raw_bytes;
    metrics_->ingested_tokens->Increment(static_cast<double>(plan.fresh));
    metrics_->ingested_bytes->Increment(static_cast<double>(raw_bytes));
    metrics_->duplicate_tokens->Increment(static_cast<double>(plan.skip));
    totals->set_chunks(totals->chunks() + 1);
    totals->set_tokens_stored(totals->tokens_stored() + plan.fresh);
    totals->set_tokens_duplicate(totals->tokens_duplicate() + plan.skip);
    PublishGauges();
    return absl::OkStatus();
  }
}

}  // namespace driftkv

namespace driftkv {

absl::Status Handler::AppendReferenced(const v1::PushChunkRequest& h, v1::AppendResponse* totals,
                                       const std::string& tenant, absl::Span<const uint32_t> token_ids) {
  absl::Status st = CheckChunkHeader(h);
  if (st.ok() && (!h.has_keys_ref() || !h.has_values_ref())) {
    st = absl::InvalidArgumentError("keys_ref and values_ref: set both");
  }
  std::shared_ptr<const Region> keep[2];
  StagedTokens t;
  t.dtype = h.dtype();
  t.tokens = h.token_count();
  const uint64_t eb = DTypeBytes(h.dtype());
  for (int k = 0; k < 2 && st.ok(); ++k) {
    const v1::TensorRef& ref = k == 0 ? h.keys_ref() : h.values_ref();
    absl::StatusOr<RegionView> view =
        regions_ == nullptr ? absl::StatusOr<RegionView>(RegionTable::NotFound(ref, k == 0 ? "keys_ref" : "values_ref"))
                            : regions_->Resolve(tenant, ref, h.tensor_bytes(), eb, k == 0 ? "keys_ref" : "values_ref");
    if (!view.ok()) {
      st = view.status();
      break;
    }
    // The staged path reads host memory (CPU backend) or memory its device
    // addresses (CUDA: its own device's, or mapped host regions).
    if (view->space == MemorySpace::kDevice && view->device != backend_->staging_device()) {
      st = absl::FailedPreconditionError(absl::StrCat(
          k == 0 ? "keys_ref" : "values_ref", ".region_id ", ref.region_id(), " is memory of CUDA device ",
          view->device, "; the ", backend_->name(), " backend stages on device ", backend_->staging_device()));
      break;
    }
    (k == 0 ? t.keys : t.values) = view->data;
    keep[k] = std::move(view->keep_alive);
  }
  if (!st.ok()) {
    metrics_->rejected_chunks->Increment();
    return st;
  }
  return AppendStaged(h, t, totals, tenant, token_ids);
}

}  // namespace driftkv
