#include "service/handler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "backends/attend_batcher.h"
#include "backends/registry.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

// Largest first_token accepted: keeps first_token + token_count far from
// overflow.
constexpr uint64_t kMaxTokenIndex = uint64_t{1} << 48;

std::string Quoted(const std::string& id) { return absl::StrCat("\"", id, "\""); }

// Rounds float tokens to bf16 bits.
void ToBf16(const float* x, size_t count, uint16_t* out) {
  for (size_t i = 0; i < count; ++i) out[i] = FloatToBf16(x[i]);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Handler>> Handler::Create(const ServiceOptions& options,
                                                         Metrics* metrics, Clock clock) {
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(options.codec);
  if (!codec.ok()) return codec.status();
  if (absl::Status st = ValidateTransform(options); !st.ok()) return st;
  if (options.layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("layers ", options.layers, " must be >= 1"));
  }
  if (options.window_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_tokens ", options.window_tokens, " must be >= 0"));
  }
  if (!clock) clock = [] { return absl::Now(); };
  std::unique_ptr<Handler> h(new Handler(options, *std::move(codec), metrics, std::move(clock)));
  h->transform_gain_ = TransformGain(options);
  if (options.transforms != nullptr) h->transforms_checksum_ = TransformsChecksum(*options.transforms);
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(h->codec_.page_layout(), options.pool_bytes);
  if (!pool.ok()) return pool.status();
  h->pool_ = *std::move(pool);
  // h->options_ holds a reference to the transform set, and is destroyed
  // after backend_ (declared before it): the set outlives the backend.
  BackendArgs args;
  args.codec = &h->codec_;
  args.pool = h->pool_.get();
  args.threads = options.backend_threads;
  args.transforms = h->options_.transforms.get();
  args.values_folded = h->options_.values_folded;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(options.backend, args);
  if (!backend.ok()) return backend.status();
  h->backend_ = *std::move(backend);
  if (options.attend_batching && h->backend_->PrefersBatchedAttend()) {
    Metrics* m = h->metrics_;
    h->backend_ = std::make_unique<BatchingBackend>(std::move(h->backend_), [m](int calls, int jobs) {
      m->attend_batch_calls->Observe(calls);
      m->attend_batch_items->Observe(jobs);
    });
  }
  h->metrics_->pool_capacity_bytes->Set(static_cast<double>(h->pool_->capacity_bytes()));
  h->metrics_->pool_capacity_pages->Set(static_cast<double>(h->pool_->capacity_pages()));
  h->PublishGauges();
  return h;
}

float Handler::value_limit() const {
  return static_cast<float>(kHalfMax / (2.0 * transform_gain_));
}

double Handler::TransformGain(const ServiceOptions& o) {
  switch (o.transform) {
    case TransformKind::kIdentity:
      return 1.0;
    case TransformKind::kHadamard:
      // Every entry of the normalised Hadamard matrix is +-1/sqrt(d).
      return std::sqrt(static_cast<double>(o.codec.head_dim));
    case TransformKind::kWush:
      break;
  }
  const TransformSet& t = *o.transforms;
  const int d = t.head_dim;
  double gain = 1.0;  // folded values pass untransformed
  for (int l = 0; l < t.layers; ++l) {
    for (int h = 0; h < t.kv_heads; ++h) {
      for (Mat m : {Mat::kKey, Mat::kValue}) {
        if (m == Mat::kValue && o.values_folded) continue;
        const float* a = t.matrix(l, h, m);
        for (int i = 0; i < d; ++i) {
          double row = 0.0;
          for (int j = 0; j < d; ++j) row += std::fabs(static_cast<double>(a[i * d + j]));
          gain = std::max(gain, row);
        }
      }
    }
  }
  return gain;
}

absl::Status Handler::CheckLayer(absl::string_view field, uint32_t layer) const {
  if (layer >= static_cast<uint32_t>(options_.layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", layer, " out of range [0, ", options_.layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status Handler::CheckSequenceId(absl::string_view field, const std::string& id) const {
  if (id.empty() || id.size() > kMaxSequenceIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", id.size(),
                                                   " bytes; it must have 1 to ",
                                                   kMaxSequenceIdBytes));
  }
  return absl::OkStatus();
}

Handler::SequencePtr Handler::Find(const std::string& id) {
  absl::MutexLock lock(&table_mu_);
  auto it = table_.find(id);
  return it == table_.end() ? nullptr : it->second;
}

absl::StatusOr<Handler::SequencePtr> Handler::FindOrCreate(const std::string& id, bool* created) {
  absl::MutexLock lock(&table_mu_);
  *created = false;
  auto it = table_.find(id);
  if (it != table_.end()) return it->second;
  if (table_.size() >= options_.max_sequences) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_sequences ", options_.max_sequences, " reached; cannot create sequence_id ",
        Quoted(id), "; release sequences or raise max_sequences"));
  }
  auto seq = std::make_shared<Sequence>(id, options_.layers);
  Touch(seq.get());
  table_.emplace(id, seq);
  *created = true;
  return seq;
}

void Handler::DropIfEmpty(const SequencePtr& seq) {
  absl::MutexLock table_lock(&table_mu_);
  absl::MutexLock lock(&seq->mu);
  if (seq->released) return;
  for (const Layer& l : seq->layers) {
    if (l.length != 0) return;
  }
  auto it = table_.find(seq->id);
  if (it != table_.end() && it->second == seq) table_.erase(it);
  seq->released = true;
}

void Handler::FreeLocked(Sequence* seq, uint64_t* tokens, uint64_t* pages) {
  const int64_t p = pool_->page_tokens();
  for (Layer& l : seq->layers) {
    *tokens += l.length;
    *pages += l.pages.size();
    pool_->Free(l.pages);
    tokens_compressed_ -= static_cast<int64_t>(l.pages.size()) * p;
    tokens_window_ -= static_cast<int64_t>(l.window_keys.size() / n());
    l.pages.clear();
    l.window_keys = {};
    l.window_values = {};
    l.length = 0;
  }
}

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

absl::Status Handler::ApplyAppend(Layer* layer, int layer_index, const AppendPlan& plan, const float* keys,
                                  const float* values, const std::vector<PageId>& pages) {
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
  // Commit.
  layer->pages.insert(layer->pages.end(), pages.begin(), pages.end());
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
  const size_t elements = static_cast<size_t>(c.token_count()) * n();
  const std::string shape = absl::StrCat("token_count ", c.token_count(), " x kv_heads ",
                                         codec_.config().kv_heads, " x head_dim ",
                                         codec_.config().head_dim);
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
      Layer& layer = seq->layers[c.layer()];
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
        st = ApplyAppend(&layer, static_cast<int>(c.layer()), plan, keys.data(), values.data(), pages);
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

absl::Status Handler::Attend(const v1::AttendRequest& request, v1::AttendResponse* response) {
  absl::Status st = AttendImpl(request, response);
  if (!st.ok()) metrics_->rejected_chunks->Increment();
  return st;
}

absl::Status Handler::AttendImpl(const v1::AttendRequest& request, v1::AttendResponse* response) {
  const int items = request.items_size();
  if (items == 0) return absl::InvalidArgumentError("items is empty; send at least one item");
  if (items > options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("items has ", items, " entries; max_batch is ", options_.max_batch));
  }
  const int d = codec_.config().head_dim, kv_heads = codec_.config().kv_heads;
  struct Item {
    std::vector<float> query, key, value;
    bool step = false;
    float scale = 0.0f;
    Sequence* seq = nullptr;
    AppendPlan plan;
  };
  std::vector<Item> work(items);
  // 1. Validate every item before touching any state.
  for (int i = 0; i < items; ++i) {
    const v1::AttendItem& it = request.items(i);
    Item& w = work[i];
    const std::string where = absl::StrCat("items[", i, "]");
    absl::Status st = CheckSequenceId(where + ".sequence_id", it.sequence_id());
    if (st.ok()) st = CheckLayer(where + ".layer", it.layer());
    if (st.ok() && (it.q_heads() == 0 || it.q_heads() % kv_heads != 0)) {
      st = absl::InvalidArgumentError(absl::StrCat(where, ".q_heads ", it.q_heads(),
                                                   " is not a positive multiple of kv_heads ",
                                                   kv_heads));
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
      w.query.resize(qe);
      TensorToFloat(it.query(), it.dtype(), qe, w.query.data());
      st = CheckValues(where + ".query", w.query.data(), qe, std::numeric_limits<float>::max());
    }
    w.step = !it.new_key().empty() || !it.new_value().empty();
    if (st.ok() && w.step) {
      const std::string shape = absl::StrCat("1 token x kv_heads ", kv_heads, " x head_dim ", d);
      st = CheckTensorBytes(where + ".new_key", it.dtype(), it.new_key().size(), n(), shape);
      if (st.ok()) {
        st = CheckTensorBytes(where + ".new_value", it.dtype(), it.new_value().size(), n(), shape);
      }
      if (st.ok()) {
        w.key.resize(n());
        w.value.resize(n());
        TensorToFloat(it.new_key(), it.dtype(), n(), w.key.data());
        TensorToFloat(it.new_value(), it.dtype(), n(), w.value.data());
        st = CheckValues(where + ".new_key", w.key.data(), n(), value_limit());
        if (st.ok()) st = CheckValues(where + ".new_value", w.value.data(), n(), value_limit());
      }
    }
    if (st.ok() && !w.step && it.has_new_token_index()) {
      st = absl::InvalidArgumentError(absl::StrCat(
          where, ".new_token_index ", it.new_token_index(), " is set but new_key/new_value are empty"));
    }
    if (st.ok() && it.has_new_token_index() && it.new_token_index() > kMaxTokenIndex) {
      st = absl::InvalidArgumentError(absl::StrCat(where, ".new_token_index ",
                                                   it.new_token_index(), " exceeds ", kMaxTokenIndex));
    }
    w.scale = it.has_softmax_scale() ? it.softmax_scale() : 1.0f / std::sqrt(static_cast<float>(d));
    if (st.ok() && !(std::isfinite(w.scale) && w.scale > 0.0f)) {
      st = absl::InvalidArgumentError(
          absl::StrCat(where, ".softmax_scale ", w.scale, " must be finite and > 0"));
    }
    if (!st.ok()) return st;
  }

  // 2. Find the sequences and lock them in id order (writers where a step appends).
  std::map<std::string, std::pair<SequencePtr, bool>> seqs;
  for (int i = 0; i < items; ++i) {
    auto& entry = seqs[request.items(i).sequence_id()];
    if (entry.first == nullptr) {
      entry.first = Find(request.items(i).sequence_id());
      if (entry.first == nullptr) {
        return absl::NotFoundError(absl::StrCat("items[", i, "].sequence_id ",
                                                Quoted(request.items(i).sequence_id()),
                                                " not found"));
      }
    }
    entry.second = entry.second || work[i].step;
    work[i].seq = entry.first.get();
  }
  // All sequences (readers, id order), then all layers ((id, layer) order).
  std::map<std::pair<std::string, uint32_t>, std::pair<Layer*, bool>> layer_locks;
  for (int i = 0; i < items; ++i) {
    const v1::AttendItem& it = request.items(i);
    auto& entry = layer_locks[{it.sequence_id(), it.layer()}];
    entry.first = &work[i].seq->layers[it.layer()];
    entry.second = entry.second || work[i].step;
  }
  for (auto& [id, entry] : seqs) entry.first->mu.ReaderLock();
  for (auto& [key, entry] : layer_locks) {
    if (entry.second) {
      entry.first->mu.Lock();
    } else {
      entry.first->mu.ReaderLock();
    }
  }
  auto unlock_all = [&] {
    for (auto& [key, entry] : layer_locks) {
      if (entry.second) {
        entry.first->mu.Unlock();
      } else {
        entry.first->mu.ReaderUnlock();
      }
    }
    for (auto& [id, entry] : seqs) entry.first->mu.ReaderUnlock();
    layer_locks.clear();  // `seqs` keeps the sequences alive until we return
  };
  absl::Status st;
  int64_t total_pages = 0;
  // 3. Plan every decode step and check every layer is non-empty, on
  // simulated lengths (items of one batch may share a layer).
  std::map<std::pair<Sequence*, uint32_t>, std::pair<int64_t, int64_t>> sim;  // length, window
  for (int i = 0; i < items && st.ok(); ++i) {
    const v1::AttendItem& it = request.items(i);
    Item& w = work[i];
    if (w.seq->released) {
      st = absl::NotFoundError(absl::StrCat("items[", i, "].sequence_id ",
                                            Quoted(it.sequence_id()), " not found (released)"));
      break;
    }
    const Layer& layer = w.seq->layers[it.layer()];
    auto key = std::make_pair(w.seq, it.layer());
    auto found = sim.find(key);
    if (found == sim.end()) {
      found = sim.emplace(key, std::make_pair(layer.length,
                                              static_cast<int64_t>(layer.window_keys.size() / n())))
                  .first;
    }
    auto& [length, window] = found->second;
    if (w.step) {
      const uint64_t first = it.has_new_token_index() ? it.new_token_index() : length;
      absl::StatusOr<AppendPlan> plan =
          PlanAppend(length, window, absl::StrCat("items[", i, "].new_token_index"),
                     it.sequence_id(), it.layer(), first, 1);
      if (!plan.ok()) {
        st = plan.status();
        break;
      }
      w.plan = *plan;
      length += plan->fresh;
      window += plan->fresh - plan->pages * pool_->page_tokens();
      total_pages += plan->pages;
    }
    if (length == 0) {
      st = absl::FailedPreconditionError(
          absl::StrCat("items[", i, "]: layer ", it.layer(), " of sequence_id ",
                       Quoted(it.sequence_id()), " holds no tokens; nothing to attend to"));
    }
  }
  // 4. Reserve all pages at once, then apply the steps.
  std::vector<PageId> reserved;
  if (st.ok()) {
    absl::StatusOr<std::vector<PageId>> r = pool_->Reserve(total_pages);
    st = r.status();
    if (st.ok()) reserved = *std::move(r);
  }
  size_t used = 0;
  for (int i = 0; i < items && st.ok(); ++i) {
    Item& w = work[i];
    if (w.step && w.plan.fresh == 0) metrics_->duplicate_tokens->Increment();  // a repeated step
    if (!w.step || w.plan.fresh == 0) continue;
    std::vector<PageId> pages(reserved.begin() + used, reserved.begin() + used + w.plan.pages);
    st = ApplyAppend(&w.seq->layers[request.items(i).layer()], static_cast<int>(request.items(i).layer()), w.plan, w.key.data(),
                     w.value.data(), pages);
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("items[", i, "]: ", st.message()));
      break;
    }
    used += pages.size();
    tokens_ingested_ += 1;
    bytes_ingested_ += 2 * n() * DTypeBytes(request.items(i).dtype());
    metrics_->ingested_tokens->Increment();
    metrics_->ingested_bytes->Increment(2.0 * n() * DTypeBytes(request.items(i).dtype()));
  }
  if (used < reserved.size()) pool_->Free(std::vector<PageId>(reserved.begin() + used, reserved.end()));
  if (!st.ok()) {
    unlock_all();
    if (total_pages > 0 || used > 0) PublishGauges();
    return st;
  }

  // 5. Attention, every item at once.
  std::vector<AttendJob> jobs(items);
  response->clear_results();
  std::vector<std::vector<float>> lse(items);
  uint64_t attended = 0;
  for (int i = 0; i < items; ++i) {
    const v1::AttendItem& it = request.items(i);
    const Layer& layer = work[i].seq->layers[it.layer()];
    v1::AttendResult* r = response->add_results();
    r->mutable_output()->resize(static_cast<size_t>(it.q_heads()) * d * sizeof(float));
    lse[i].resize(it.q_heads());
    AttendJob& j = jobs[i];
    j.pages = absl::MakeConstSpan(layer.pages);
    j.window = Bf16Tokens{layer.window_keys.data(), layer.window_values.data(),
                          static_cast<int64_t>(layer.window_keys.size() / n())};
    j.window_id = layer.id;
    j.window_first = static_cast<int64_t>(layer.pages.size()) * pool_->page_tokens();
    j.query = work[i].query.data();
    j.q_heads = static_cast<int>(it.q_heads());
    j.softmax_scale = work[i].scale;
    j.layer = static_cast<int>(it.layer());
    j.out = reinterpret_cast<float*>(r->mutable_output()->data());
    j.lse = lse[i].data();
    r->set_tokens(layer.length);
    r->set_compressed_tokens(layer.pages.size() * pool_->page_tokens());
    attended += layer.length;
  }
  backend_->Attend(absl::MakeSpan(jobs));
  for (auto& [id, entry] : seqs) Touch(entry.first.get());
  unlock_all();
  for (int i = 0; i < items; ++i) {
    if (!jobs[i].status.ok()) {
      return absl::Status(jobs[i].status.code(),
                          absl::StrCat("items[", i, "]: ", jobs[i].status.message()));
    }
    response->mutable_results(i)->mutable_lse()->Assign(lse[i].begin(), lse[i].end());
  }
  attention_tokens_ += attended;
  metrics_->attention_tokens->Increment(static_cast<double>(attended));
  metrics_->attention_items->Increment(items);
  if (total_pages > 0 || used > 0 || std::any_of(work.begin(), work.end(), [](const Item& w) { return w.step; })) {
    PublishGauges();
  }
  return absl::OkStatus();
}

absl::Status Handler::Read(const v1::ReadRequest& request,
                           const std::function<bool(const v1::ReadChunk&)>& sink) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (st.ok()) st = CheckLayer("layer", request.layer());
  const int dtype = request.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : request.dtype();
  if (st.ok() && DTypeBytes(dtype) == 0) {
    st = absl::InvalidArgumentError(
        absl::StrCat("dtype ", request.dtype(), " is not one of BF16, FP16, F32"));
  }
  if (!st.ok()) return st;
  SequencePtr seq = Find(request.sequence_id());
  if (seq == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found"));
  }
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  uint64_t end = 0;
  {
    absl::ReaderMutexLock lock(&seq->mu);
    if (seq->released) {
      return absl::NotFoundError(
          absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found (released)"));
    }
    Layer& layer = seq->layers[request.layer()];
    absl::ReaderMutexLock layer_lock(&layer.mu);
    const uint64_t length = layer.length;
    if (request.first_token() > length) {
      return absl::OutOfRangeError(absl::StrCat("first_token ", request.first_token(),
                                                " is past the end of layer ", request.layer(),
                                                " (", length, " tokens)"));
    }
    end = request.token_count() == 0 ? length : request.first_token() + request.token_count();
    if (request.token_count() > length || end > length) {
      return absl::OutOfRangeError(absl::StrCat(
          "first_token ", request.first_token(), " + token_count ", request.token_count(),
          " exceeds the length of layer ", request.layer(), " (", length, " tokens)"));
    }
  }
  std::vector<float> keys, values;
  for (uint64_t pos = request.first_token(); pos < end;) {
    const int64_t count = std::min<uint64_t>(end - pos, options_.read_chunk_tokens);
    keys.resize(count * n);
    values.resize(count * n);
    int64_t compressed = 0;
    {
      absl::ReaderMutexLock lock(&seq->mu);
      if (seq->released) {
        return absl::AbortedError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()),
                                               " was released during Read"));
      }
      Layer& layer = seq->layers[request.layer()];
      absl::ReaderMutexLock layer_lock(&layer.mu);
      const int64_t paged = static_cast<int64_t>(layer.pages.size()) * p;
      for (int64_t t = 0; t < count;) {
        const int64_t tok = static_cast<int64_t>(pos) + t;
        if (tok < paged) {
          const int64_t in_page = tok % p;
          const int64_t run = std::min(count - t, p - in_page);
          st = backend_->DecodeTokens(layer.pages[tok / p], static_cast<int>(request.layer()), static_cast<int>(in_page),
                                      static_cast<int>(run), keys.data() + t * n,
                                      values.data() + t * n);
          if (!st.ok()) return st;
          compressed += run;
          t += run;
        } else {
          const size_t w = static_cast<size_t>(tok - paged) * n;
          for (size_t j = 0; j < n; ++j) {
            keys[t * n + j] = Bf16ToFloat(layer.window_keys[w + j]);
            values[t * n + j] = Bf16ToFloat(layer.window_values[w + j]);
          }
          ++t;
        }
      }
    }
    Touch(seq.get());
    v1::ReadChunk chunk;
    chunk.set_first_token(pos);
    chunk.set_token_count(static_cast<uint32_t>(count));
    chunk.set_dtype(static_cast<v1::DType>(dtype));
    chunk.set_compressed_tokens(static_cast<uint32_t>(compressed));
    FloatToTensor(keys.data(), keys.size(), dtype, chunk.mutable_keys());
    FloatToTensor(values.data(), values.size(), dtype, chunk.mutable_values());
    if (!sink(chunk)) return absl::CancelledError("the client stopped reading");
    pos += count;
  }
  return absl::OkStatus();
}

absl::Status Handler::Release(const v1::ReleaseRequest& request, v1::ReleaseResponse* response) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (!st.ok()) return st;
  SequencePtr seq;
  {
    absl::MutexLock lock(&table_mu_);
    auto it = table_.find(request.sequence_id());
    if (it != table_.end()) {
      seq = it->second;
      table_.erase(it);
    }
  }
  if (seq == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found"));
  }
  uint64_t tokens = 0, pages = 0;
  {
    absl::MutexLock lock(&seq->mu);
    if (seq->released) {
      return absl::NotFoundError(
          absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found (released)"));
    }
    FreeLocked(seq.get(), &tokens, &pages);
    seq->released = true;
  }
  response->set_tokens_freed(tokens);
  response->set_pages_freed(pages);
  ++sequences_released_;
  metrics_->sequences_released->Increment();
  PublishGauges();
  return absl::OkStatus();
}

int Handler::ExpireIdle() {
  if (options_.ttl_seconds <= 0.0) return 0;
  const int64_t cutoff = absl::ToUnixNanos(clock_() - absl::Seconds(options_.ttl_seconds));
  std::vector<SequencePtr> idle;
  {
    absl::MutexLock lock(&table_mu_);
    for (auto it = table_.begin(); it != table_.end();) {
      if (it->second->last_access_ns.load() < cutoff) {
        idle.push_back(it->second);
        table_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  int expired = 0;
  for (const SequencePtr& seq : idle) {
    absl::MutexLock lock(&seq->mu);
    if (seq->released) continue;
    uint64_t tokens = 0, pages = 0;
    FreeLocked(seq.get(), &tokens, &pages);
    seq->released = true;
    ++expired;
  }
  if (expired > 0) {
    sequences_expired_ += expired;
    metrics_->sequences_expired->Increment(expired);
    PublishGauges();
  }
  return expired;
}

void Handler::PublishGauges() {
  const int64_t in_use = pool_->pages_in_use();
  metrics_->pool_pages_in_use->Set(static_cast<double>(in_use));
  metrics_->pool_bytes_in_use->Set(static_cast<double>(in_use) * pool_->page_stride());
  metrics_->tokens_compressed->Set(static_cast<double>(tokens_compressed_.load()));
  metrics_->tokens_window->Set(static_cast<double>(tokens_window_.load()));
  metrics_->window_bytes->Set(4.0 * n() * tokens_window_.load());
  size_t sequences;
  {
    absl::MutexLock lock(&table_mu_);
    sequences = table_.size();
  }
  metrics_->sequences->Set(static_cast<double>(sequences));
}

void Handler::Info(v1::InfoResponse* r) const {
  const DQuantConfig& c = codec_.config();
  r->set_server_version(kServerVersion);
  r->set_backend(backend_->name());
  r->set_layers(options_.layers);
  r->set_kv_heads(c.kv_heads);
  r->set_head_dim(c.head_dim);
  r->set_codec("dquant");
  r->set_key_levels(c.key_levels);
  r->set_value_levels(c.value_levels);
  r->set_key_payload_bytes(c.key_bytes);
  r->set_value_payload_bytes(c.value_bytes);
  r->set_alpha(c.alpha);
  r->set_page_tokens(pool_->page_tokens());
  r->set_window_tokens(options_.window_tokens);
  r->set_page_bytes(pool_->page_stride());
  r->set_capacity_pages(pool_->capacity_pages());
  r->set_capacity_bytes(pool_->capacity_bytes());
  r->set_key_bits_per_value(codec_.key_bits_per_value());
  r->set_value_bits_per_value(codec_.value_bits_per_value());
  r->set_max_message_bytes(options_.max_message_bytes);
  r->set_max_batch(options_.max_batch);
  r->set_max_sequences(options_.max_sequences);
  r->set_ttl_seconds(options_.ttl_seconds);
  r->set_transform(TransformName(options_.transform));
  if (options_.transforms != nullptr) {
    r->set_transforms_checksum(transforms_checksum_);
    r->set_transforms_calibration_tokens(options_.transforms->calibration_tokens);
    r->set_values_folded(options_.values_folded);
  }
}

void Handler::Stats(v1::StatsResponse* r) const {
  {
    absl::MutexLock lock(&table_mu_);
    r->set_sequences(table_.size());
  }
  const int64_t in_use = pool_->pages_in_use();
  r->set_pages_in_use(in_use);
  r->set_capacity_pages(pool_->capacity_pages());
  r->set_bytes_in_use(static_cast<uint64_t>(in_use) * pool_->page_stride());
  r->set_capacity_bytes(pool_->capacity_bytes());
  r->set_tokens_compressed(tokens_compressed_.load());
  r->set_tokens_window(tokens_window_.load());
  r->set_window_bytes(static_cast<uint64_t>(4) * n() * tokens_window_.load());
  r->set_sequences_expired(sequences_expired_.load());
  r->set_sequences_released(sequences_released_.load());
  r->set_tokens_ingested(tokens_ingested_.load());
  r->set_bytes_ingested(bytes_ingested_.load());
  r->set_attention_tokens(attention_tokens_.load());
  absl::MutexLock lock(&stats_mu_);
  r->set_symbols_key(codec_stats_.keys.symbols);
  r->set_symbols_moved_key(codec_stats_.keys.moved);
  r->set_symbols_value(codec_stats_.values.symbols);
  r->set_symbols_moved_value(codec_stats_.values.moved);
  r->set_encode_retries(codec_stats_.keys.retries + codec_stats_.values.retries);
}

}  // namespace driftkv
