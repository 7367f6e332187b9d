// Handler::Append: plans a chunk on a layer, reserves its pages
// all-or-nothing and stores it (also the decode steps of Attend).
#include "service/handler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "service/handler_internal.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::kMaxTokenIndex;
using handler_internal::Quoted;
using handler_internal::ToBf16;

absl::StatusOr<Handler::AppendPlan> Handler::PlanAppend(int64_t length, int64_t window,
                                                        absl::string_view where,
                                                        const std::string& id, uint32_t layer,
                                                        uint64_t first, int64_t count) const {
  if (first > static_cast<uint64_t>(length)) {
    return absl::OutOfRangeError(absl::StrCat(
        where, " ", first, " leaves a gap: layer ", layer, " of sequence_id ", Quoted(id),
        " holds ", length, " tokens, so the next token is ", length));
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

absl::Status Handler::ApplyAppend(LayerState* layer, int layer_index, const AppendPlan& plan, const float* keys,
                                  const float* values, const std::vector<PageId>& pages, const TierHeld& held) {
  if (plan.fresh == 0) return absl::OkStatus();
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  const int64_t window = static_cast<int64_t>(layer->window_keys.size() / n);
  // The new tokens in bf16, after the current window.
  std::vector<uint16_t> all_k(layer->window_keys), all_v(layer->window_values);
  all_k.resize((window + plan.fresh) * n);
  all_v.resize((window + plan.fresh) * n);
  ToBf16(keys + plan.skip * n, plan.fresh * n, all_k.data() + window * n);
  ToBf16(values + plan.skip * n, plan.fresh * n, all_v.data() + window * n);

  const int64_t encoded = plan.pages * p;
  if (plan.pages > 0) {
    std::vector<float> fk(encoded * n), fv(encoded * n);
    for (size_t i = 0; i < fk.size(); ++i) {
      fk[i] = Bf16ToFloat(all_k[i]);
      fv[i] = Bf16ToFloat(all_v[i]);
    }
    std::vector<EncodeJob> jobs(plan.pages);
    for (int64_t i = 0; i < plan.pages; ++i) {
      jobs[i].keys = fk.data() + i * p * n;
      jobs[i].values = fv.data() + i * p * n;
      jobs[i].page = pages[i];
      jobs[i].layer = layer_index;
    }
    const int64_t first_page_token = static_cast<int64_t>(layer->pages.size()) * p;
    absl::Status st = backend_->EncodePages(absl::MakeSpan(jobs));
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("encoding tokens [", first_page_token, ", ",
                                                  first_page_token + encoded, "): ", st.message()));
    }
    absl::MutexLock lock(&stats_mu_);
    for (const EncodeJob& j : jobs) {
      metrics_->RecordPage(j.stats, j.key_utilization, j.value_utilization);
      codec_stats_.Add(j.stats);
    }
  }
  // Checksums of the new pages' cold form, before any promotion.
  std::vector<PageChecksum> sums(pages.size());
  for (size_t i = 0; i < pages.size() && i < static_cast<size_t>(plan.pages); ++i) {
    sums[i] = Crc32c(pool_->page(pages[i]), pool_->page_stride());
  }
  // A hot layer's new pages go hot at once; with no hot page to be had,
  // even after demoting other layers, the layer goes cold instead (an
  // Append is never refused for the hot tier's sake).
  std::vector<PageId> hot;
  if (layer->hot && !pages.empty()) {
    TierHeld mine = held;
    mine.layers.insert(layer->id);
    absl::Status st = PromoteNewPages(layer, pages, mine, &hot);
    if (!st.ok() && !absl::IsResourceExhausted(st)) return st;
    if (!st.ok()) {
      st = DemoteLocked(layer, kDemoteAppend);
      if (!st.ok()) return st;
    }
  }
  // Commit.
  if (!hot.empty()) {
    layer->pages.insert(layer->pages.end(), hot.begin(), hot.end());
    pool_->Free(pages);
  } else {
    layer->pages.insert(layer->pages.end(), pages.begin(), pages.end());
  }
  layer->page_sums.insert(layer->page_sums.end(), sums.begin(), sums.end());
  layer->window_keys.assign(all_k.begin() + encoded * n, all_k.end());
  layer->window_values.assign(all_v.begin() + encoded * n, all_v.end());
  layer->length += plan.fresh;
  tokens_compressed_ += encoded;
  tokens_window_ += plan.fresh - encoded;
  return absl::OkStatus();
}

absl::Status Handler::Append(const v1::AppendChunk& c, v1::AppendResponse* totals) {
  absl::Status st = CheckSequenceId("sequence_id", c.sequence_id());
  if (st.ok()) st = CheckLayer("layer", c.layer());
  if (st.ok() && c.token_count() == 0) st = absl::InvalidArgumentError("token_count 0 must be >= 1");
  if (st.ok() && c.first_token() > kMaxTokenIndex) {
    st = absl::InvalidArgumentError(
        absl::StrCat("first_token ", c.first_token(), " exceeds ", kMaxTokenIndex));
  }
  // The optional shape fields, before the byte counts (which cannot tell
  // 8 heads x 64 from 4 x 128).
  if (st.ok() && c.has_kv_heads() && c.kv_heads() != static_cast<uint32_t>(codec_->kv_heads())) {
    st = absl::InvalidArgumentError(absl::StrCat("kv_heads ", c.kv_heads(), " does not match the server's kv_heads ",
                                                 codec_->kv_heads()));
  }
  if (st.ok() && c.has_head_dim() && c.head_dim() != static_cast<uint32_t>(codec_->head_dim())) {
    st = absl::InvalidArgumentError(absl::StrCat("head_dim ", c.head_dim(), " does not match the server's head_dim ",
                                                 codec_->head_dim()));
  }
  const size_t elements = static_cast<size_t>(c.token_count()) * n();
  const std::string shape = absl::StrCat("token_count ", c.token_count(), " x kv_heads ",
                                         codec_->kv_heads(), " x head_dim ",
                                         codec_->head_dim());
  if (st.ok()) st = CheckTensorBytes("keys", c.dtype(), c.keys().size(), elements, shape);
  if (st.ok()) st = CheckTensorBytes("values", c.dtype(), c.values().size(), elements, shape);
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

  if (c.first_token() != 0 && Find(c.sequence_id()) == nullptr) {
    metrics_->rejected_chunks->Increment();
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(c.sequence_id()),
                                            " not found (a new sequence starts at first_token 0, got ",
                                            c.first_token(), ")"));
  }
  for (int attempt = 0;; ++attempt) {
    bool created = false;
    absl::StatusOr<SequencePtr> found = FindOrCreate(c.sequence_id(), &created);
    if (!found.ok()) {
      metrics_->rejected_chunks->Increment();
      return found.status();
    }
    Sequence* seq = found->get();
    AppendPlan plan;
    {
      absl::ReaderMutexLock seq_lock(&seq->mu);
      if (seq->released) {
        // Released between lookup and lock: this chunk starts a new one.
        if (attempt < 3) continue;
        return absl::AbortedError(absl::StrCat("sequence_id ", Quoted(c.sequence_id()),
                                               " was released while appending; retry"));
      }
      LayerState& layer = seq->layers[c.layer()];
      absl::MutexLock layer_lock(&layer.mu);
      absl::StatusOr<AppendPlan> planned =
          PlanAppend(layer.length, static_cast<int64_t>(layer.window_keys.size() / n()),
                     "first_token", c.sequence_id(), c.layer(), c.first_token(), c.token_count());
      st = planned.status();
      std::vector<PageId> pages;
      if (st.ok()) {
        plan = *planned;
        absl::StatusOr<std::vector<PageId>> reserved = pool_->Reserve(plan.pages);
        st = reserved.status();
        if (st.ok()) pages = *std::move(reserved);
      }
      if (st.ok()) {
        TierHeld held;
        held.sequences.insert(seq);
        st = ApplyAppend(&layer, static_cast<int>(c.layer()), plan, keys.data(), values.data(), pages, held);
        if (!st.ok()) pool_->Free(pages);
      }
      if (st.ok()) Touch(seq);
    }
    if (!st.ok()) {
      metrics_->rejected_chunks->Increment();
      if (created) DropIfEmpty(*found);
      PublishGauges();
      return st;
    }
    if (created) metrics_->sequences_created->Increment();
    const uint64_t raw_bytes = 2 * plan.fresh * n() * DTypeBytes(c.dtype());
    tokens_ingested_ += plan.fresh;
    bytes_ingested_ += raw_bytes;
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
