// HotTier (service/hot_tier.h): promotion, the LRU and the promotion
// thread (demotion: hot_tier_demote.cc).
#include "service/hot_tier.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"

namespace driftkv {

HotTier::HotTier(PagePool& cold, PagePool& hot, Backend& backend, const PageVerifier& verifier, Metrics* metrics,
                 ServiceClock clock, HotPromotion promotion, double idle_seconds, std::function<void()> after_move,
                 bool keep_cold_copies)
    : cold_(cold),
      hot_(hot),
      backend_(backend),
      verifier_(verifier),
      metrics_(metrics),
      clock_(std::move(clock)),
      promotion_(promotion),
      idle_seconds_(idle_seconds),
      after_move_(std::move(after_move)),
      copies_(keep_cold_copies ? std::make_unique<ColdCopies>(cold) : nullptr) {
  if (promotion_ == HotPromotion::kAsync) promoter_ = std::thread([this] { PromotionThread(); });
}

HotTier::~HotTier() {
  Stop();
}

void HotTier::Stop() {
  {
    absl::MutexLock lock(&promote_mu_);
    promote_stop_ = true;
  }
  if (promoter_.joinable()) promoter_.join();
}

void HotTier::AddHot(const SequencePtr& seq, int layer_index, uint64_t id) {
  const int64_t now = NowNs();
  absl::MutexLock lock(&hot_mu_);
  auto [it, inserted] = hot_layers_.try_emplace(id, Entry{seq, layer_index, now});
  if (!inserted) it->second.attended_ns = now;
}

void HotTier::RemoveHot(uint64_t id) {
  absl::MutexLock lock(&hot_mu_);
  auto it = hot_layers_.find(id);
  if (it == hot_layers_.end()) return;
  hot_layers_.erase(it);
}

void HotTier::Touch(uint64_t id, int64_t now_ns) {
  Touch(absl::MakeConstSpan(&id, 1), now_ns);
}

void HotTier::Touch(absl::Span<const uint64_t> ids, int64_t now_ns) {
  absl::MutexLock lock(&hot_mu_);
  for (uint64_t id : ids) {
    auto it = hot_layers_.find(id);
    if (it != hot_layers_.end() && it->second.attended_ns < now_ns) it->second.attended_ns = now_ns;
  }
}

std::vector<std::pair<int64_t, uint64_t>> HotTier::LruLocked() const {
  std::vector<std::pair<int64_t, uint64_t>> lru;
  lru.reserve(hot_layers_.size());
  for (const auto& [id, e] : hot_layers_) lru.emplace_back(e.attended_ns, id);
  std::sort(lru.begin(), lru.end());
  return lru;
}

HeldBytes HotTier::MoveBytes(int64_t count, bool to_hot) const {
  const int64_t cold = count * static_cast<int64_t>(cold_.page_stride());
  const int64_t hot = count * static_cast<int64_t>(hot_.page_stride());
  return to_hot ? HeldBytes{-cold, hot, 0} : HeldBytes{cold, -hot, 0};
}

void HotTier::AddShared(const SequencePtr& seq, int layer_index) {
  AddHot(seq, layer_index, seq->layers[layer_index].id);
}

void HotTier::FreeLayer(LayerState* layer) {
  hot_.Free(layer->pages);
  if (copies_ != nullptr) copies_->Drop(layer->id);
  RemoveHot(layer->id);
  layer->hot = false;
  layer->hot_sums.Clear();
}

void HotTier::KeepPlacedCopies(const LayerState& layer, size_t first, std::vector<PageId> cold) {
  if (copies_ == nullptr) {
    cold_.Free(cold);
    return;
  }
  if (copies_->Extend(layer.id, first, std::move(cold))) {
    PublishCopies();
  }
}

void HotTier::PublishCopies() const {
  metrics_->tier_cold_copies->Set(static_cast<double>(cold_copy_pages()));
}

int64_t HotTier::ReclaimCopies(int64_t pages, int partition) {
  if (copies_ == nullptr) return 0;
  int64_t dropped = 0;
  const int64_t freed = copies_->Reclaim(pages, partition, &dropped);
  metrics_->tier_cold_copies_reclaimed->Increment(static_cast<double>(dropped));
  PublishCopies();
  return freed;
}

absl::StatusOr<std::vector<PageId>> HotTier::ReserveHot(int64_t count, const Held& held, int device) {
  const int64_t capacity = hot_.partition_begin(device + 1) - hot_.partition_begin(device);
  if (count > capacity) {
    return absl::ResourceExhaustedError(
        hot_.partitions() == 1
            ? absl::StrCat(count, " hot pages needed; the hot tier holds ", capacity)
            : absl::StrCat(count, " hot pages needed; the hot tier holds ", capacity, " on device slot ", device));
  }
  absl::flat_hash_set<uint64_t> tried;
  for (;;) {
    absl::StatusOr<std::vector<PageId>> pages = hot_.Reserve(count, device);
    if (pages.ok() || !DemoteVictim(held, device, &tried)) return pages;
  }
}

absl::Status HotTier::PromoteOnBackend(absl::Span<const TierMove> moves, PageChecksum* cold_sums,
                                       PageChecksum* hot_sums, std::shared_ptr<PendingChecksums>* later) {
  const absl::Time start = absl::Now();
  absl::Status st = later != nullptr ? backend_.PromotePagesCheckedLater(moves, cold_, hot_, cold_sums, hot_sums, later)
                                     : backend_.PromotePagesChecked(moves, cold_, hot_, cold_sums, hot_sums);
  metrics_->tier_promotion_backend_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return st;
}

bool HotTier::PromoteLayer(const SequencePtr& seq, int layer_index, const absl::flat_hash_set<uint64_t>& exclude,
                           absl::Status* corrupt) {
  const absl::Time start = absl::Now();
  LayerState& layer = seq->layers[layer_index];
  int64_t need = 0;
  {
    absl::ReaderMutexLock seq_lock(&seq->mu);
    // A sequence on a level below (a queued promotion that waited while
    // it moved down) comes back with its next Attend, cold.
    if (seq->released || seq->below) return false;
    absl::ReaderMutexLock layer_lock(&layer.mu);
    if (layer.hot) return true;
    need = static_cast<int64_t>(layer.pages.size());
  }
  Held held;
  held.layers = exclude;
  held.layers.insert(layer.id);
  absl::StatusOr<std::vector<PageId>> hot = ReserveHot(need, held, seq->device);
  if (!hot.ok()) {
    metrics_->tier_promotions_skipped->Increment();
    return false;
  }
  bool promoted = false;
  {
    absl::ReaderMutexLock seq_lock(&seq->mu);
    absl::MutexLock layer_lock(&layer.mu);
    if (seq->released || seq->below || layer.hot) {
      hot_.Free(*hot);
      return !seq->released && !seq->below;
    }
    // Appends may have added pages since they were counted (pages never
    // go away while the sequence lives).
    const int64_t more = static_cast<int64_t>(layer.pages.size()) - need;
    if (more > 0) {
      absl::StatusOr<std::vector<PageId>> extra = hot_.Reserve(more, seq->device);
      if (!extra.ok()) {
        hot_.Free(*hot);
        metrics_->tier_promotions_skipped->Increment();
        return false;
      }
      hot->insert(hot->end(), extra->begin(), extra->end());
    }
    // The tenant pays for the layer's pages at the hot page size; without
    // room in its max_bytes the layer stays cold.
    absl::StatusOr<ByteCharge> charge =
        ByteCharge::Take(seq->usage, MoveBytes(static_cast<int64_t>(layer.pages.size()), /*to_hot=*/true));
    if (!charge.ok()) {
      hot_.Free(*hot);
      metrics_->tier_promotions_skipped->Increment();
      return false;
    }
    const int p = cold_.page_tokens();
    std::vector<TierMove> moves(layer.pages.size());
    for (size_t i = 0; i < moves.size(); ++i) moves[i] = TierMove{layer.pages[i], (*hot)[i], p};
    // A corrupt cold page must not become a valid-looking hot page: the
    // cold pages' checksums as the move read them (the backend's copy)
    // against the stored ones before anything is committed; the level
    // form's checksums from what the backend holds after the move.
    const LayerName name{seq->id, layer_index};
    std::vector<PageChecksum> cold_sums(moves.size()), sums(moves.size());
    absl::Status st = PromoteOnBackend(moves, cold_sums.data(), sums.data());
    if (st.ok() || absl::IsDataLoss(st)) {
      absl::Status check = verifier_.CheckColdSums(cold_sums, layer.page_sums, 0, name, kCheckPromote);
      if (!check.ok()) {
        hot_.Free(*hot);
        if (corrupt != nullptr) *corrupt = check;
        return false;
      }
    }
    if (!st.ok()) {
      // A page that does not decode: the layer stays cold, and attending
      // it reports the DataLoss.
      hot_.Free(*hot);
      return false;
    }
    charge->Keep();
    HotSums hot_sums;
    hot_sums.Set(std::move(sums));
    CommitPromotion(seq, layer_index, *std::move(hot), std::move(hot_sums));
    promoted = true;
  }
  metrics_->tier_promotion_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return promoted;
}

absl::Status HotTier::PlaceNewPages(LayerState* layer, TenantUsage* usage, const LayerName& name,
                                    const std::vector<PageId>& cold, const Held& held, std::vector<PageId>* hot,
                                    std::vector<PageChecksum>* hot_sums) {
  hot->clear();
  hot_sums->clear();
  Held mine = held;  // the layer never makes room for its own pages
  mine.layers.insert(layer->id);
  // The new cold pages are on the layer's device: so go its hot ones.
  NewPagesReservation r;
  const NewPagesWanted w{
      layer, usage, &name, static_cast<int64_t>(cold.size()), cold.empty() ? 0 : cold_.partition_of(cold[0]), &r};
  if (absl::Status st = ReserveNewPagesFor(w, mine); !st.ok() || r.empty()) return st;
  const int p = cold_.page_tokens();
  std::vector<TierMove> moves(cold.size());
  for (size_t i = 0; i < moves.size(); ++i) moves[i] = TierMove{cold[i], r.pages()[i], p};
  // The cold pages' checksums were read from the backend's copy by the
  // caller a moment ago, under this lock: that was their check.
  absl::Status st = backend_.PromotePages(moves);
  if (st.ok()) st = verifier_.HotSums(r.pages(), hot_sums);
  if (!st.ok()) {
    r = NewPagesReservation();
    if (!absl::IsResourceExhausted(st)) return st;
    return DemoteLocked(layer, usage, name, kDemoteAppend);
  }
  r.Keep();
  pages_promoted_ += moves.size();
  metrics_->tier_pages_moved[0]->Increment(static_cast<double>(moves.size()));
  *hot = r.pages();
  return absl::OkStatus();
}

HotTier::NewPagesReservation& HotTier::NewPagesReservation::operator=(NewPagesReservation&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    pages_ = std::move(o.pages_);
    charge_ = std::move(o.charge_);
    o.pool_ = nullptr;
    o.pages_.clear();
  }
  return *this;
}

void HotTier::NewPagesReservation::Keep() {
  charge_.Keep();
  pool_ = nullptr;
}

void HotTier::NewPagesReservation::Release() {
  if (pool_ != nullptr) pool_->Free(pages_);
  pool_ = nullptr;
  pages_.clear();
  charge_ = ByteCharge();
}

absl::Status HotTier::ReserveNewPages(absl::Span<const NewPagesWanted> wanted, const Held& held, size_t* failed) {
  *failed = 0;
  Held mine = held;  // no layer makes room for the batch's pages
  for (const NewPagesWanted& w : wanted) mine.layers.insert(w.layer->id);
  bool together = wanted.size() > 1;
  int64_t total = 0;
  for (const NewPagesWanted& w : wanted) {
    total += w.count;
    together = together && w.usage == wanted[0].usage && w.device == wanted[0].device;
  }
  if (together) {
    // One reservation shared out; each layer's part charged on its own, so
    // that each can be kept or given back alone.
    bool charged = true;
    for (const NewPagesWanted& w : wanted) {
      *w.reservation = NewPagesReservation();
      absl::StatusOr<ByteCharge> part = ByteCharge::Take(w.usage, MoveBytes(w.count, /*to_hot=*/true));
      if (!part.ok()) {
        charged = false;
        break;
      }
      w.reservation->charge_ = *std::move(part);
    }
    absl::StatusOr<std::vector<PageId>> reserved =
        charged ? ReserveHot(total, mine, wanted[0].device) : absl::ResourceExhaustedError("tenant bytes");
    if (reserved.ok()) {
      size_t at = 0;
      for (const NewPagesWanted& w : wanted) {
        w.reservation->pool_ = &hot_;
        w.reservation->pages_.assign(reserved->begin() + at, reserved->begin() + at + w.count);
        at += w.count;
      }
      return absl::OkStatus();
    }
    for (const NewPagesWanted& w : wanted) *w.reservation = NewPagesReservation();
    if (!absl::IsResourceExhausted(reserved.status())) return reserved.status();  // *failed: the first
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (absl::Status st = ReserveNewPagesFor(wanted[i], mine); !st.ok()) {
      *failed = i;
      for (size_t j = i; j < wanted.size(); ++j) *wanted[j].reservation = NewPagesReservation();
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status HotTier::ReserveNewPagesFor(const NewPagesWanted& w, const Held& held) {
  NewPagesReservation& r = *w.reservation;
  r = NewPagesReservation();
  absl::StatusOr<ByteCharge> charge = ByteCharge::Take(w.usage, MoveBytes(w.count, /*to_hot=*/true));
  if (!charge.ok()) return DemoteLocked(w.layer, w.usage, *w.name, kDemoteAppend);
  absl::StatusOr<std::vector<PageId>> reserved = ReserveHot(w.count, held, w.device);
  if (!reserved.ok()) {
    if (!absl::IsResourceExhausted(reserved.status())) return reserved.status();
    return DemoteLocked(w.layer, w.usage, *w.name, kDemoteAppend);
  }
  r.pool_ = &hot_;
  r.pages_ = *std::move(reserved);
  r.charge_ = *std::move(charge);
  return absl::OkStatus();
}

void HotTier::CountEncodedHot(int64_t pages) {
  pages_promoted_ += pages;
  pages_encoded_hot_ += pages;
  metrics_->tier_pages_moved[0]->Increment(static_cast<double>(pages));
  metrics_->tier_pages_encoded_hot->Increment(static_cast<double>(pages));
}

void HotTier::CommitPromotion(const SequencePtr& seq, int layer_index, std::vector<PageId> hot, HotSums hot_sums) {
  LayerState& layer = seq->layers[layer_index];
  const size_t pages = hot.size();
  if (copies_ != nullptr) {
    copies_->Keep(layer.id, std::move(layer.pages));
    PublishCopies();
  } else {
    cold_.Free(layer.pages);
  }
  layer.pages = std::move(hot);
  layer.hot_sums = std::move(hot_sums);
  layer.hot = true;
  AddHot(seq, layer_index, layer.id);
  ++promotions_;
  pages_promoted_ += pages;
  metrics_->tier_promotions->Increment();
  metrics_->tier_pages_moved[0]->Increment(static_cast<double>(pages));
}

bool HotTier::PlaceNewPagesTogether(TenantUsage* usage, absl::Span<const NewPages> batch, const Held& held) {
  int64_t total = 0;
  int device = -1;
  for (const NewPages& b : batch) {
    total += static_cast<int64_t>(b.cold->size());
    if (b.cold->empty()) continue;
    // Layers of several devices are placed one by one.
    const int d = cold_.partition_of(b.cold->front());
    if (device >= 0 && d != device) return false;
    device = d;
  }
  if (device < 0) device = 0;
  absl::StatusOr<ByteCharge> charge = ByteCharge::Take(usage, MoveBytes(total, /*to_hot=*/true));
  if (!charge.ok()) return false;
  Held mine = held;  // no layer makes room for the batch's pages
  for (const NewPages& b : batch) mine.layers.insert(b.layer->id);
  absl::StatusOr<std::vector<PageId>> reserved = ReserveHot(total, mine, device);
  if (!reserved.ok()) return false;
  const int p = cold_.page_tokens();
  std::vector<TierMove> moves;
  moves.reserve(total);
  for (const NewPages& b : batch) {
    for (PageId c : *b.cold) moves.push_back(TierMove{c, (*reserved)[moves.size()], p});
  }
  std::vector<PageChecksum> sums;
  absl::Status st = backend_.PromotePages(moves);
  if (st.ok()) st = verifier_.HotSums(*reserved, &sums);
  if (!st.ok()) {
    hot_.Free(*reserved);
    return false;
  }
  charge->Keep();
  pages_promoted_ += moves.size();
  metrics_->tier_pages_moved[0]->Increment(static_cast<double>(moves.size()));
  size_t at = 0;
  for (const NewPages& b : batch) {
    const size_t count = b.cold->size();
    b.hot->assign(reserved->begin() + at, reserved->begin() + at + count);
    b.hot_sums->assign(sums.begin() + at, sums.begin() + at + count);
    at += count;
  }
  return true;
}

bool HotTier::PromoteTogether(const std::vector<std::pair<SequencePtr, int>>& layers,
                              const absl::flat_hash_set<uint64_t>& ids, absl::Status* corrupt, size_t* failed) {
  const absl::Time start = absl::Now();
  struct Candidate {
    size_t k;  // index into `layers`
    Sequence* seq;
    int index;
    LayerState* layer;
    std::vector<PageId> hot;
    size_t first_move = 0;  // its pages' moves: [first_move, first_move + hot.size())
    std::optional<ByteCharge> charge;
  };
  std::vector<Candidate> c;
  std::vector<int64_t> total(hot_.partitions(), 0);  // hot pages wanted a device
  for (size_t k = 0; k < layers.size(); ++k) {
    Sequence* seq = layers[k].first.get();
    LayerState& layer = seq->layers[layers[k].second];
    absl::ReaderMutexLock seq_lock(&seq->mu);
    if (seq->released || seq->below) continue;
    absl::ReaderMutexLock layer_lock(&layer.mu);
    if (layer.hot) continue;
    c.push_back(Candidate{k, seq, layers[k].second, &layer, {}, 0, std::nullopt});
    total[seq->device] += static_cast<int64_t>(layer.pages.size());
  }
  if (c.size() < 2) return false;
  Held held;
  held.layers = ids;
  for (const Candidate& x : c) held.layers.insert(x.layer->id);
  // Each device's hot pages from its own partition (one device: one
  // reservation); any device short, and none is kept.
  std::vector<std::vector<PageId>> spare(total.size());
  for (size_t d = 0; d < total.size(); ++d) {
    if (total[d] == 0) continue;
    absl::StatusOr<std::vector<PageId>> reserved = ReserveHot(total[d], held, static_cast<int>(d));
    if (!reserved.ok()) {
      for (const std::vector<PageId>& pages : spare) hot_.Free(pages);
      return false;
    }
    spare[d] = *std::move(reserved);
  }
  // Every sequence as a reader in address order, then every layer as a
  // writer in (sequence, layer) order (LOCK ORDER in handler.h).
  std::vector<Candidate*> order;
  for (Candidate& x : c) order.push_back(&x);
  std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
    return a->seq != b->seq ? a->seq < b->seq : a->index < b->index;
  });
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || order[i]->seq != order[i - 1]->seq) order[i]->seq->mu.ReaderLock();
  }
  for (Candidate* x : order) x->layer->mu.Lock();
  // Under the locks: the layers still cold and live, each with the hot
  // pages for the pages it holds now (appends may have added some) and its
  // tenant's charge; one move for them all.
  const int p = cold_.page_tokens();
  std::vector<TierMove> moves;
  std::vector<Candidate*> moving;
  bool fits = true;
  for (Candidate& x : c) {
    if (x.seq->released || x.seq->below || x.layer->hot) continue;
    const size_t need = x.layer->pages.size();
    std::vector<PageId>& mine = spare[x.seq->device];
    if (mine.size() < need) {
      fits = false;
      break;
    }
    absl::StatusOr<ByteCharge> charge = ByteCharge::Take(x.seq->usage, MoveBytes(static_cast<int64_t>(need), true));
    if (!charge.ok()) {  // stays cold, as PromoteLayer leaves it
      metrics_->tier_promotions_skipped->Increment();
      continue;
    }
    x.charge.emplace(*std::move(charge));
    x.hot.assign(mine.end() - need, mine.end());
    mine.resize(mine.size() - need);
    x.first_move = moves.size();
    for (size_t i = 0; i < need; ++i) moves.push_back(TierMove{x.layer->pages[i], x.hot[i], p});
    moving.push_back(&x);
  }
  absl::Status st = fits ? absl::OkStatus() : absl::ResourceExhaustedError("pages added meanwhile");
  // The level sums may come later (the Attend that asked for these layers
  // need not wait for them; docs/hot_tier.md, "Limits").
  std::vector<PageChecksum> cold_sums(moves.size()), hot_sums(moves.size());
  std::shared_ptr<PendingChecksums> later;
  if (st.ok() && !moves.empty()) {
    st = PromoteOnBackend(moves, cold_sums.data(), hot_sums.data(), &later);
  }
  bool done = st.ok();
  if (done) {
    // In the order of `layers`: those before a layer whose cold page fails
    // its checksum are promoted, it and those after it are not.
    bool stop = false;
    for (Candidate* x : moving) {
      const size_t count = x->hot.size();
      if (!stop) {
        const LayerName name{x->seq->id, x->index};
        absl::Status check = verifier_.CheckColdSums(absl::MakeConstSpan(cold_sums).subspan(x->first_move, count),
                                                     x->layer->page_sums, 0, name, kCheckPromote);
        if (!check.ok()) {
          stop = true;
          *corrupt = check;
          *failed = x->k;
        }
      }
      if (stop) {
        hot_.Free(x->hot);
        continue;
      }
      x->charge->Keep();
      HotSums sums;
      if (later != nullptr) {
        sums.SetLater(later, x->first_move, count);
      } else {
        sums.Set(std::vector<PageChecksum>(hot_sums.begin() + x->first_move, hot_sums.begin() + x->first_move + count));
      }
      CommitPromotion(layers[x->k].first, x->index, std::move(x->hot), std::move(sums));
    }
  } else {
    for (Candidate* x : moving) hot_.Free(x->hot);
  }
  for (const std::vector<PageId>& pages : spare) hot_.Free(pages);
  for (auto it = order.rbegin(); it != order.rend(); ++it) (*it)->layer->mu.Unlock();
  for (size_t i = order.size(); i-- > 0;) {
    if (i == 0 || order[i]->seq != order[i - 1]->seq) order[i]->seq->mu.ReaderUnlock();
  }
  // Charges not kept are refunded as the candidates go.
  if (done) metrics_->tier_promotion_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return done;
}

absl::Status HotTier::Prepare(const std::vector<std::pair<SequencePtr, int>>& layers,
                              const absl::flat_hash_set<uint64_t>& ids, size_t* failed) {
  if (promotion_ == HotPromotion::kSync) {
    // All the cold layers in one move when they fit; else one by one.
    absl::Status corrupt;
    size_t at = 0;
    if (PromoteTogether(layers, ids, &corrupt, &at)) {
      if (!corrupt.ok() && failed != nullptr) *failed = at;
      return corrupt;
    }
  }
  for (size_t k = 0; k < layers.size(); ++k) {
    const auto& [seq, index] = layers[k];
    LayerState& layer = seq->layers[index];
    {
      absl::ReaderMutexLock seq_lock(&seq->mu);
      if (seq->released) continue;
      absl::ReaderMutexLock layer_lock(&layer.mu);
      if (layer.hot) continue;
    }
    if (promotion_ == HotPromotion::kSync) {
      absl::Status corrupt;
      if (!PromoteLayer(seq, index, ids, &corrupt) && !corrupt.ok()) {
        if (failed != nullptr) *failed = k;
        return corrupt;
      }
    } else if (!layer.promotion_queued.exchange(true)) {
      absl::MutexLock lock(&promote_mu_);
      promote_queue_.emplace_back(seq, index);
    }
  }
  return absl::OkStatus();
}

void HotTier::PromotionThread() {
  for (;;) {
    std::pair<SequencePtr, int> job;
    {
      absl::MutexLock lock(&promote_mu_);
      promote_mu_.Await(absl::Condition(
          +[](HotTier* t)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->promote_mu_) { return t->promote_stop_ || !t->promote_queue_.empty(); },
          this));
      if (promote_stop_) return;
      job = std::move(promote_queue_.front());
      promote_queue_.pop_front();
      ++promote_running_;
    }
    PromoteLayer(job.first, job.second, {});
    job.first->layers[job.second].promotion_queued = false;
    if (after_move_) after_move_();
    absl::MutexLock lock(&promote_mu_);
    --promote_running_;
  }
}

void HotTier::DrainPromotions() {
  absl::MutexLock lock(&promote_mu_);
  promote_mu_.Await(absl::Condition(
      +[](HotTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->promote_mu_) {
        return t->promote_stop_ || (t->promote_queue_.empty() && t->promote_running_ == 0);
      },
      this));
}

std::vector<uint64_t> HotTier::LruOrder() const {
  absl::MutexLock lock(&hot_mu_);
  std::vector<uint64_t> ids;
  ids.reserve(hot_layers_.size());
  for (const auto& [ns, id] : LruLocked()) ids.push_back(id);
  return ids;
}

size_t HotTier::layers() const {
  absl::MutexLock lock(&hot_mu_);
  return hot_layers_.size();
}

void HotTier::PublishGauges() const {
  metrics_->tier_pages[1]->Set(static_cast<double>(hot_.pages_in_use()));
  PublishCopies();
  absl::MutexLock lock(&hot_mu_);
  metrics_->hot_layers->Set(static_cast<double>(hot_layers_.size()));
}

}  // namespace driftkv
