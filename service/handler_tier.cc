// The hot tier in the handler (HOT TIER in handler.h; docs/hot_tier.md,
// "Service"): promotion before an Attend takes its locks (sync) or on a
// background thread (async), demotion of the least recently attended layers
// to make room, new pages of hot layers promoted at once, idle demotion.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"

namespace driftkv {

void Handler::AddHot(const SequencePtr& seq, int layer_index, uint64_t id) {
  const int64_t now = absl::ToUnixNanos(clock_());
  absl::MutexLock lock(&hot_mu_);
  auto [it, inserted] = hot_layers_.try_emplace(id, HotEntry{seq, layer_index, now});
  if (!inserted) {
    hot_lru_.erase({it->second.attended_ns, id});
    it->second.attended_ns = now;
  }
  hot_lru_.insert({now, id});
}

void Handler::RemoveHot(uint64_t id) {
  absl::MutexLock lock(&hot_mu_);
  auto it = hot_layers_.find(id);
  if (it == hot_layers_.end()) return;
  hot_lru_.erase({it->second.attended_ns, id});
  hot_layers_.erase(it);
}

void Handler::TouchHot(uint64_t id, int64_t now_ns) {
  absl::MutexLock lock(&hot_mu_);
  auto it = hot_layers_.find(id);
  if (it == hot_layers_.end() || it->second.attended_ns >= now_ns) return;
  hot_lru_.erase({it->second.attended_ns, id});
  it->second.attended_ns = now_ns;
  hot_lru_.insert({now_ns, id});
}

absl::Status Handler::DemoteLocked(LayerState* layer, DemotionReason reason) {
  const int p = pool_->page_tokens();
  absl::StatusOr<std::vector<PageId>> cold = pool_->Reserve(static_cast<int64_t>(layer->pages.size()));
  if (!cold.ok()) return cold.status();
  std::vector<TierMove> moves(layer->pages.size());
  for (size_t i = 0; i < moves.size(); ++i) moves[i] = TierMove{layer->pages[i], (*cold)[i], p};
  if (absl::Status st = backend_->DemotePages(moves); !st.ok()) {
    pool_->Free(*cold);
    return st;
  }
  // The demoted bytes must be the cold page the hot one was promoted from.
  for (size_t i = 0; i < moves.size(); ++i) {
    absl::Status st = VerifyColdPage(*layer, i, (*cold)[i], "", -1, kCheckDemote);
    if (!st.ok()) {
      pool_->Free(*cold);
      return st;
    }
  }
  hot_pool_->Free(layer->pages);
  layer->pages = *std::move(cold);
  layer->hot = false;
  RemoveHot(layer->id);
  ++demotions_;
  pages_demoted_ += moves.size();
  metrics_->tier_demotions[reason]->Increment();
  metrics_->tier_pages_moved[1]->Increment(static_cast<double>(moves.size()));
  return absl::OkStatus();
}

bool Handler::DemoteVictim(const TierHeld& held, absl::flat_hash_set<uint64_t>* tried) {
  for (;;) {
    SequencePtr seq;
    int index = 0;
    uint64_t id = 0;
    {
      absl::MutexLock lock(&hot_mu_);
      for (const auto& [ns, candidate] : hot_lru_) {
        if (held.layers.contains(candidate) || tried->contains(candidate)) continue;
        const HotEntry& e = hot_layers_.at(candidate);
        seq = e.seq;
        index = e.layer;
        id = candidate;
        break;
      }
    }
    if (seq == nullptr) return false;
    tried->insert(id);
    // Never block here: the caller may hold other layers' locks (see HOT
    // TIER in handler.h). A layer in use is not idle anyway.
    const bool lock_seq = !held.sequences.contains(seq.get());
    if (lock_seq && !seq->mu.ReaderTryLock()) continue;
    bool demoted = false;
    LayerState& layer = seq->layers[index];
    if (!seq->released && layer.mu.TryLock()) {
      // A hot layer without pages holds nothing worth demoting.
      demoted = layer.hot && layer.id == id && !layer.pages.empty() && DemoteLocked(&layer, kDemoteBudget).ok();
      layer.mu.Unlock();
    }
    if (lock_seq) seq->mu.ReaderUnlock();
    if (demoted) return true;
  }
}

absl::StatusOr<std::vector<PageId>> Handler::ReserveHot(int64_t count, const TierHeld& held) {
  if (count > hot_pool_->capacity_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(count, " hot pages needed; the hot tier holds ",
                                                     hot_pool_->capacity_pages()));
  }
  absl::flat_hash_set<uint64_t> tried;
  for (;;) {
    absl::StatusOr<std::vector<PageId>> pages = hot_pool_->Reserve(count);
    if (pages.ok() || !DemoteVictim(held, &tried)) return pages;
  }
}

bool Handler::PromoteLayer(const SequencePtr& seq, int layer_index, const absl::flat_hash_set<uint64_t>& exclude) {
  const absl::Time start = absl::Now();
  LayerState& layer = seq->layers[layer_index];
  int64_t need = 0;
  {
    absl::ReaderMutexLock seq_lock(&seq->mu);
    if (seq->released) return false;
    absl::ReaderMutexLock layer_lock(&layer.mu);
    if (layer.hot) return true;
    need = static_cast<int64_t>(layer.pages.size());
  }
  TierHeld held;
  held.layers = exclude;
  held.layers.insert(layer.id);
  absl::StatusOr<std::vector<PageId>> hot = ReserveHot(need, held);
  if (!hot.ok()) {
    metrics_->tier_promotions_skipped->Increment();
    return false;
  }
  bool promoted = false;
  {
    absl::ReaderMutexLock seq_lock(&seq->mu);
    absl::MutexLock layer_lock(&layer.mu);
    if (seq->released || layer.hot) {
      hot_pool_->Free(*hot);
      return !seq->released;
    }
    // Appends may have added pages since they were counted (pages never
    // go away while the sequence lives).
    const int64_t more = static_cast<int64_t>(layer.pages.size()) - need;
    if (more > 0) {
      absl::StatusOr<std::vector<PageId>> extra = hot_pool_->Reserve(more);
      if (!extra.ok()) {
        hot_pool_->Free(*hot);
        metrics_->tier_promotions_skipped->Increment();
        return false;
      }
      hot->insert(hot->end(), extra->begin(), extra->end());
    }
    const int p = pool_->page_tokens();
    std::vector<TierMove> moves(layer.pages.size());
    for (size_t i = 0; i < moves.size(); ++i) moves[i] = TierMove{layer.pages[i], (*hot)[i], p};
    if (absl::Status st = backend_->PromotePages(moves); !st.ok()) {
      // A page that does not decode: the layer stays cold, and attending
      // it reports the DataLoss.
      hot_pool_->Free(*hot);
      return false;
    }
    pool_->Free(layer.pages);
    layer.pages = *std::move(hot);
    layer.hot = true;
    AddHot(seq, layer_index, layer.id);
    ++promotions_;
    pages_promoted_ += moves.size();
    metrics_->tier_promotions->Increment();
    metrics_->tier_pages_moved[0]->Increment(static_cast<double>(moves.size()));
    promoted = true;
  }
  metrics_->tier_promotion_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return promoted;
}

absl::Status Handler::PromoteNewPages(LayerState* layer, const std::vector<PageId>& cold, const TierHeld& held,
                                      std::vector<PageId>* hot) {
  absl::StatusOr<std::vector<PageId>> reserved = ReserveHot(static_cast<int64_t>(cold.size()), held);
  if (!reserved.ok()) return reserved.status();
  const int p = pool_->page_tokens();
  std::vector<TierMove> moves(cold.size());
  for (size_t i = 0; i < moves.size(); ++i) moves[i] = TierMove{cold[i], (*reserved)[i], p};
  if (absl::Status st = backend_->PromotePages(moves); !st.ok()) {
    hot_pool_->Free(*reserved);
    return st;
  }
  pages_promoted_ += moves.size();
  metrics_->tier_pages_moved[0]->Increment(static_cast<double>(moves.size()));
  *hot = *std::move(reserved);
  return absl::OkStatus();
}

void Handler::PrepareHotTier(const v1::AttendRequest& request, const std::string& tenant) {
  // The request's layers, each once; they are never demoted to make room
  // for each other.
  std::vector<std::pair<SequencePtr, int>> layers;
  absl::flat_hash_set<uint64_t> ids;
  for (const v1::AttendItem& it : request.items()) {
    SequencePtr seq = Find(TenantKey(tenant, it.sequence_id()));
    if (seq == nullptr) continue;  // the locking step reports it
    if (ids.insert(seq->layers[it.layer()].id).second) layers.emplace_back(std::move(seq), it.layer());
  }
  for (auto& [seq, index] : layers) {
    LayerState& layer = seq->layers[index];
    {
      absl::ReaderMutexLock seq_lock(&seq->mu);
      if (seq->released) continue;
      absl::ReaderMutexLock layer_lock(&layer.mu);
      if (layer.hot) continue;
    }
    if (options_.hot_promotion == HotPromotion::kSync) {
      PromoteLayer(seq, index, ids);
    } else if (!layer.promotion_queued.exchange(true)) {
      absl::MutexLock lock(&promote_mu_);
      promote_queue_.emplace_back(seq, index);
    }
  }
}

void Handler::PromotionThread() {
  for (;;) {
    std::pair<SequencePtr, int> job;
    {
      absl::MutexLock lock(&promote_mu_);
      promote_mu_.Await(absl::Condition(
          +[](Handler* h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h->promote_mu_) {
            return h->promote_stop_ || !h->promote_queue_.empty();
          },
          this));
      if (promote_stop_) return;
      job = std::move(promote_queue_.front());
      promote_queue_.pop_front();
      ++promote_running_;
    }
    PromoteLayer(job.first, job.second, {});
    job.first->layers[job.second].promotion_queued = false;
    PublishGauges();
    absl::MutexLock lock(&promote_mu_);
    --promote_running_;
  }
}

void Handler::DrainPromotions() {
  absl::MutexLock lock(&promote_mu_);
  promote_mu_.Await(absl::Condition(
      +[](Handler* h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h->promote_mu_) {
        return h->promote_stop_ || (h->promote_queue_.empty() && h->promote_running_ == 0);
      },
      this));
}

bool Handler::LayerIsHot(const std::string& sequence_id, uint32_t layer) {
  SequencePtr seq = Find(sequence_id);
  if (seq == nullptr || layer >= seq->layers.size()) return false;
  absl::ReaderMutexLock seq_lock(&seq->mu);
  if (seq->released) return false;
  absl::ReaderMutexLock layer_lock(&seq->layers[layer].mu);
  return seq->layers[layer].hot;
}

void Handler::DemoteIdle() {
  const int64_t cutoff = absl::ToUnixNanos(clock_() - absl::Seconds(options_.hot_idle_seconds));
  std::vector<std::pair<SequencePtr, int>> idle;
  {
    absl::MutexLock lock(&hot_mu_);
    for (const auto& [ns, id] : hot_lru_) {
      if (ns >= cutoff) break;
      const HotEntry& e = hot_layers_.at(id);
      idle.emplace_back(e.seq, e.layer);
    }
  }
  for (auto& [seq, index] : idle) {
    absl::ReaderMutexLock seq_lock(&seq->mu);
    if (seq->released) continue;
    LayerState& layer = seq->layers[index];
    absl::MutexLock layer_lock(&layer.mu);
    if (!layer.hot) continue;
    {
      // Attended since the list was made?
      absl::MutexLock lock(&hot_mu_);
      auto it = hot_layers_.find(layer.id);
      if (it == hot_layers_.end() || it->second.attended_ns >= cutoff) continue;
    }
    DemoteLocked(&layer, kDemoteIdle).IgnoreError();  // no cold room: stays hot, tried again later
  }
  if (!idle.empty()) PublishGauges();
}

}  // namespace driftkv
