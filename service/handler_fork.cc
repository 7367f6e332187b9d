// Handler::Fork: a new sequence that shares the first whole pages of every
// layer of an existing one by reference (docs/prefix_cache.md).
//
// The new sequence is built where no one else sees it: the references to
// the source's pages are taken, and the tenant charged, while every layer
// of the source is held as a reader (no tier move or release can free a
// page meanwhile); then the table enters it, checking the creation rules
// again under its own lock. A refusal there gives every reference and
// charge back, so a failed Fork leaves nothing behind. Last, its hot
// layers join the hot tier's LRU (HotTier::AddShared).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"

namespace driftkv {

using handler_internal::Quoted;

namespace {

// Every layer of a sequence held as a reader, in ascending order (the
// LOCK ORDER of service/handler.h), until destroyed. REQUIRES: the
// sequence's mu held.
class LayerReaders {
 public:
  explicit LayerReaders(std::vector<LayerState>& layers) : layers_(layers) {
    for (LayerState& l : layers_) l.mu.ReaderLock();
  }
  ~LayerReaders() {
    for (auto l = layers_.rbegin(); l != layers_.rend(); ++l) l->mu.ReaderUnlock();
  }
  LayerReaders(const LayerReaders&) = delete;
  LayerReaders& operator=(const LayerReaders&) = delete;

 private:
  std::vector<LayerState>& layers_;
};

// INVALID_ARGUMENT for the first layer of `source` with fewer than
// `tokens` tokens in pages. REQUIRES: its layers held.
absl::Status CheckPaged(const Sequence& source, const std::string& source_id, uint64_t tokens, int64_t p) {
  for (size_t l = 0; l < source.layers.size(); ++l) {
    const uint64_t paged = static_cast<uint64_t>(source.layers[l].pages.size()) * p;
    if (tokens > paged) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens ", tokens, " exceeds the ", paged, " paged tokens of layer ", l, " of source_sequence_id ",
          Quoted(source_id), "; only tokens in full pages are shared (the bf16 window's are not)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Handler::Fork(const v1::ForkRequest& request, v1::ForkResponse* response, const std::string& tenant) {
  const std::string& source_id = request.source_sequence_id();
  const std::string& id = request.sequence_id();
  const uint64_t tokens = request.tokens();
  const int64_t p = pool_->page_tokens();
  absl::Status st = CheckSequenceId("source_sequence_id", source_id);
  if (st.ok()) st = CheckSequenceId("sequence_id", id);
  if (st.ok() && id == source_id) {
    st = absl::InvalidArgumentError(
        absl::StrCat("sequence_id ", Quoted(id), " is also the source_sequence_id; a fork needs a new id"));
  }
  if (st.ok() && (tokens == 0 || tokens % p != 0)) {
    st = absl::InvalidArgumentError(absl::StrCat("tokens ", tokens, " is not a positive multiple of page_tokens ", p,
                                                 "; a fork shares whole pages (append the rest to it)"));
  }
  if (!st.ok()) return st;
  SequencePtr source = table_->Find(TenantKey(tenant, source_id));
  if (source == nullptr)
    return absl::NotFoundError(absl::StrCat("source_sequence_id ", Quoted(source_id), " not found"));
  // The source's tenant is the caller's (the key says so): its ledger pays.
  TenantUsage* usage = source->usage;
  const std::string key = TenantKey(tenant, id);
  st = table_->CheckNew(key, id, usage, request.new_incarnation());
  if (!st.ok()) return st;

  const int64_t pages = static_cast<int64_t>(tokens / p);  // per layer
  const int64_t shared = pages * options_.layers;
  // The pages live in the source's partition: so does the fork.
  auto fork = std::make_shared<Sequence>(key, options_.layers, usage, source->device);
  ByteCharge bytes;
  {
    absl::ReaderMutexLock source_lock(&source->mu);
    if (source->released) {
      return absl::NotFoundError(absl::StrCat("source_sequence_id ", Quoted(source_id), " not found (released)"));
    }
    LayerReaders layers(source->layers);
    st = CheckPaged(*source, source_id, tokens, p);
    if (!st.ok()) return st;
    for (size_t i = 0; i < source->layers.size(); ++i) {
      fork->layers[i].pages.assign(source->layers[i].pages.begin(), source->layers[i].pages.begin() + pages);
      fork->layers[i].hot = source->layers[i].hot;
    }
    // The tenant pays for the fork's pages as if they were its own, at
    // their tier's page size (TenantUsage counts what each sequence
    // holds; the pool counts distinct pages).
    st = usage->ChargePages(shared);
    if (!st.ok()) return st;
    absl::StatusOr<ByteCharge> taken = ByteCharge::Take(usage, table_->BytesOf(*fork));
    if (!taken.ok()) {
      usage->RefundPages(shared);
      return taken.status();
    }
    bytes = *std::move(taken);
    for (size_t i = 0; i < source->layers.size(); ++i) {
      const LayerState& from = source->layers[i];
      LayerState& to = fork->layers[i];
      (from.hot ? *hot_pool_ : *pool_).Retain(to.pages);
      to.page_sums.assign(from.page_sums.begin(), from.page_sums.begin() + pages);
      if (from.hot) to.hot_sums.assign(from.hot_sums.begin(), from.hot_sums.begin() + pages);
      const size_t digests = std::min(from.digests.size(), static_cast<size_t>(pages * p));
      to.digests.assign(from.digests.begin(), from.digests.begin() + digests);
      to.length = static_cast<int64_t>(tokens);
    }
  }

  st = table_->Insert(fork, id, request.new_incarnation());
  if (!st.ok()) {
    // No one has seen the fork: its references go back as they came.
    for (LayerState& l : fork->layers) (l.hot ? *hot_pool_ : *pool_).Free(l.pages);
    usage->RefundPages(shared);
    return st;  // `bytes` refunds the bytes
  }
  bytes.Keep();
  table_->CountTokens(shared * p, 0);
  table_->Touch(source.get());
  if (hot_ != nullptr) {
    // Hot layers join the LRU unless something moved or released them
    // since the table made the fork visible.
    absl::ReaderMutexLock fork_lock(&fork->mu);
    for (size_t i = 0; i < fork->layers.size() && !fork->released; ++i) {
      LayerState& l = fork->layers[i];
      absl::ReaderMutexLock layer_lock(&l.mu);
      if (l.hot) hot_->AddShared(fork, static_cast<int>(i));
    }
  }
  metrics_->sequences_created->Increment();
  response->clear_layers();
  for (int i = 0; i < options_.layers; ++i) {
    v1::LayerLength* l = response->add_layers();
    l->set_tokens(tokens);
    l->set_compressed_tokens(tokens);
    l->set_window_tokens(0);
  }
  response->set_pages_shared(static_cast<uint64_t>(shared));
  PublishGauges();
  return absl::OkStatus();
}

}  // namespace driftkv
