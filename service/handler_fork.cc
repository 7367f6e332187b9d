// Handler::Fork: a new sequence that shares the first whole pages of every
// layer of an existing one, or of a prefix the prefix index holds, by
// reference (docs/prefix_cache.md).
//
// The new sequence is built where no one else sees it: the references to
// the source's pages are taken while every layer of the source is held as
// a reader (no tier move or release can free a page meanwhile), or under
// the prefix index's lock (no eviction can); then the tenant is charged
// and the table enters it, checking the creation rules again under its
// own lock. A refusal gives every reference and charge back, so a failed
// Fork leaves nothing behind. Last, its hot layers join the hot tier's LRU
// (HotTier::AddShared); a fork from a prefix is cold until attended.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"
#include "service/token_ids.h"

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
  if (!request.prefix_token_ids().empty() || !request.prefix_page_keys().empty()) {
    return ForkFromPrefix(request, response, tenant);
  }
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
  // The fork shares the source's pages: they come back from a level below first.
  std::vector<SpillPin> pins;
  st = Resident(source.get(), source_id, &pins);
  if (!st.ok()) return st;
  // The source's tenant is the caller's (the key says so): its ledger pays.
  TenantUsage* usage = source->usage;
  const std::string key = TenantKey(tenant, id);
  st = table_->CheckNew(key, id, usage, request.new_incarnation());
  if (!st.ok()) return st;

  const int64_t pages = static_cast<int64_t>(tokens / p);  // per layer
  // The pages live in the source's partition: so does the fork.
  auto fork = std::make_shared<Sequence>(key, options_.layers, usage, source->device);
  {
    absl::ReaderMutexLock source_lock(&source->mu);
    if (source->released) {
      return absl::NotFoundError(absl::StrCat("source_sequence_id ", Quoted(source_id), " not found (released)"));
    }
    LayerReaders layers(source->layers);
    st = CheckPaged(*source, source_id, tokens, p);
    if (!st.ok()) return st;
    // The hot layers' level sums first (they may still be in the
    // backend's hands), so that nothing below can fail.
    std::vector<std::vector<PageChecksum>> hot_sums(source->layers.size());
    for (size_t i = 0; i < source->layers.size(); ++i) {
      const LayerState& from = source->layers[i];
      if (!from.hot) continue;
      std::vector<PageChecksum> joined;
      absl::StatusOr<absl::Span<const PageChecksum>> sums = from.hot_sums.View(&joined);
      if (!sums.ok()) return sums.status();
      hot_sums[i].assign(sums->begin(), sums->begin() + pages);
    }
    // The references are taken while the source's layers are held: no
    // tier move or release can free a page meanwhile.
    for (size_t i = 0; i < source->layers.size(); ++i) {
      const LayerState& from = source->layers[i];
      LayerState& to = fork->layers[i];
      to.pages.assign(from.pages.begin(), from.pages.begin() + pages);
      to.hot = from.hot;
      (from.hot ? *hot_pool_ : *pool_).Retain(to.pages);
      to.page_sums.assign(from.page_sums.begin(), from.page_sums.begin() + pages);
      if (from.hot) to.hot_sums.Set(std::move(hot_sums[i]));
      const size_t digests = std::min(from.digests.size(), static_cast<size_t>(pages * p));
      to.digests.assign(from.digests.begin(), from.digests.begin() + digests);
      to.length = static_cast<int64_t>(tokens);
    }
    absl::MutexLock ids(&source->token_ids.mu);
    CopyTokenIds(source->token_ids, static_cast<int64_t>(tokens), static_cast<int>(p), &fork->token_ids);
  }
  st = EnterFork(fork, id, request.new_incarnation(), pages * options_.layers, tokens, response);
  if (st.ok()) table_->Touch(source.get());
  return st;
}

absl::Status Handler::EnterFork(const SequencePtr& fork, const std::string& id, bool new_incarnation, int64_t shared,
                                uint64_t tokens, v1::ForkResponse* response) {
  TenantUsage* usage = fork->usage;
  // No one has seen the fork: on a refusal its references go back as they came.
  auto give_back = [&] {
    for (LayerState& l : fork->layers) (l.hot ? *hot_pool_ : *pool_).Free(l.pages);
  };
  // The tenant pays for the fork's pages as if they were its own, at
  // their tier's page size (TenantUsage counts what each sequence
  // holds; the pool counts distinct pages).
  absl::Status st = usage->ChargePages(shared);
  if (!st.ok()) {
    give_back();
    return st;
  }
  absl::StatusOr<ByteCharge> bytes = ByteCharge::Take(usage, table_->BytesOf(*fork));
  if (bytes.ok()) st = table_->Insert(fork, id, new_incarnation);
  if (!bytes.ok() || !st.ok()) {
    give_back();
    usage->RefundPages(shared);
    return bytes.ok() ? st : bytes.status();  // `bytes` refunds the bytes
  }
  bytes->Keep();
  const int64_t p = pool_->page_tokens();
  table_->CountTokens(shared * p, 0);
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
  response->set_tokens(tokens);
  PublishGauges();
  return absl::OkStatus();
}

absl::Status Handler::ForkFromPrefix(const v1::ForkRequest& request, v1::ForkResponse* response,
                                     const std::string& tenant) {
  const std::string& id = request.sequence_id();
  const int64_t p = pool_->page_tokens();
  absl::Status st = CheckSequenceId("sequence_id", id);
  if (st.ok() && !request.source_sequence_id().empty()) {
    st = absl::InvalidArgumentError(absl::StrCat("source_sequence_id ", Quoted(request.source_sequence_id()),
                                                 " and a prefix (prefix_token_ids or prefix_page_keys) are both "
                                                 "set; name one source"));
  }
  std::vector<PageKey> keys;
  int64_t most = 0;
  if (st.ok()) {
    st = PrefixPages(request.tokens(), request.prefix_token_ids(), request.prefix_page_keys(),
                     "with a prefix it bounds the whole pages taken", "a fork shares whole pages", &keys, &most);
  }
  if (!st.ok()) return st;
  TenantUsage* usage = table_->Usage(tenant);
  const std::string key = TenantKey(tenant, id);
  st = table_->CheckNew(key, id, usage, request.new_incarnation());
  if (!st.ok()) return st;

  const PageKey ns = NamespaceOf(tenant);
  PrefixIndex::Taken taken;
  PrefixIndex::Match match;
  const int64_t pages = index_->Take(ns, keys, most, &taken, &match);
  if (pages == 0) {
    return absl::NotFoundError(
        absl::StrCat("no stored prefix of the prompt for sequence_id ", Quoted(id), ": ", MissMessage(match, tenant)));
  }
  const uint64_t tokens = static_cast<uint64_t>(pages * p);
  // The pages are cold, in the partition Take found them in.
  auto fork = std::make_shared<Sequence>(key, options_.layers, usage, taken.partition);
  for (int i = 0; i < options_.layers; ++i) {
    LayerState& to = fork->layers[i];
    to.pages = std::move(taken.pages[i]);
    to.page_sums = std::move(taken.sums[i]);
    to.digests = std::move(taken.digests[i]);
    to.length = static_cast<int64_t>(tokens);
  }
  {
    TokenIds& t = fork->token_ids;
    absl::MutexLock ids(&t.mu);
    t.keys.assign(keys.begin(), keys.begin() + pages);
    if (!request.prefix_token_ids().empty()) {
      t.ids.assign(request.prefix_token_ids().begin(), request.prefix_token_ids().begin() + tokens);
    } else {
      t.ids_begin = static_cast<int64_t>(tokens);
    }
  }
  st = EnterFork(fork, id, request.new_incarnation(), pages * options_.layers, tokens, response);
  if (st.ok()) metrics_->prefix_pages_forked->Increment(static_cast<double>(pages * options_.layers));
  return st;
}

}  // namespace driftkv
