// HotTier (service/hot_tier.h): demotion, the level pages back to the
// cold pool: kept copies taken back where their checksums hold, the rest
// coded by the backend; by budget (DemoteVictim), by idling (DemoteIdle, a
// sequence's layers together) and for a caller (DemoteLocked).
#include "service/hot_tier.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace driftkv {

std::vector<std::vector<PageId>> HotTier::TakeCopies(absl::Span<LayerState* const> layers,
                                                     absl::Span<const LayerName> names) {
  std::vector<std::vector<PageId>> kept(layers.size());
  if (copies_ == nullptr) return kept;
  std::vector<PageId> all;
  for (size_t i = 0; i < layers.size(); ++i) {
    kept[i] = copies_->Take(layers[i]->id);
    if (kept[i].size() > layers[i]->pages.size()) {
      cold_.Free(kept[i]);
      kept[i].clear();
    }
    all.insert(all.end(), kept[i].begin(), kept[i].end());
  }
  if (all.empty()) return kept;
  std::vector<PageChecksum> sums;
  if (!verifier_.ColdSums(all, &sums).ok()) {
    // Unchecked copies are not given back: the pages are coded instead.
    for (std::vector<PageId>& k : kept) {
      cold_.Free(k);
      k.clear();
    }
    return kept;
  }
  // A copy that no longer matches (memory corrupted under it) is counted
  // as a checksum failure and freed with its layer's other copies; the
  // layer's pages are coded from the hot form.
  size_t at = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const size_t k = kept[i].size();
    const absl::Span<const PageChecksum> computed = absl::MakeConstSpan(sums).subspan(at, k);
    at += k;
    if (k == 0) continue;
    if (!verifier_
             .CheckColdSums(computed, absl::MakeConstSpan(layers[i]->page_sums).first(k), 0, names[i], kCheckDemote)
             .ok()) {
      cold_.Free(kept[i]);
      kept[i].clear();
    }
  }
  return kept;
}

absl::Status HotTier::DemoteLocked(LayerState* layer, TenantUsage* usage, const LayerName& name,
                                   DemotionReason reason) {
  DemoteJob job{layer, usage, name, std::move(TakeCopies(absl::MakeSpan(&layer, 1), absl::MakeSpan(&name, 1))[0]),
                absl::OkStatus()};
  DemoteTogetherLocked(absl::MakeSpan(&job, 1), reason);
  return job.status;
}

void HotTier::DemoteTogetherLocked(absl::Span<DemoteJob> jobs, DemotionReason reason) {
  // A job's first kept.size() pages go back to their cold copies; the rest
  // are coded. Whatever fails a job leaves its layer hot and its copies
  // kept; the others go on.
  auto fail = [&](DemoteJob& j, absl::Status st) {
    if (!j.kept.empty()) copies_->Keep(j.layer->id, std::move(j.kept));
    j.kept.clear();
    j.status = std::move(st);
  };
  auto coded = [](const DemoteJob& j) { return absl::MakeConstSpan(j.layer->pages).subspan(j.kept.size()); };
  // The hot pages as the backend holds them must be the level pages
  // recorded at promotion: a corrupt one would demote into a cold page (and
  // the cold check below would catch it only as a cold mismatch).
  std::vector<PageId> all;
  for (const DemoteJob& j : jobs) all.insert(all.end(), coded(j).begin(), coded(j).end());
  std::vector<PageChecksum> sums;
  if (absl::Status st = verifier_.HotSums(all, &sums); !st.ok()) {
    for (DemoteJob& j : jobs) fail(j, st);
    return;
  }
  size_t at = 0;
  for (DemoteJob& j : jobs) {
    const size_t k = j.kept.size(), c = coded(j).size();
    std::vector<PageChecksum> joined;
    absl::StatusOr<absl::Span<const PageChecksum>> recorded = j.layer->hot_sums.View(&joined);
    absl::Status st = recorded.ok() ? verifier_.CheckHotSums(absl::MakeConstSpan(sums).subspan(at, c),
                                                             recorded->subspan(k), k, j.name, kCheckDemote)
                                    : recorded.status();
    at += c;
    if (!st.ok()) fail(j, st);
  }
  // Cold pages for the coded ones, on the device whose hot partition holds
  // each layer; one backend move for them all.
  const int p = cold_.page_tokens();
  std::vector<std::vector<PageId>> cold(jobs.size());
  std::vector<TierMove> moves;
  for (size_t i = 0; i < jobs.size(); ++i) {
    DemoteJob& j = jobs[i];
    if (!j.status.ok()) continue;
    const absl::Span<const PageId> from = coded(j);
    const int device = j.layer->pages.empty() ? 0 : hot_.partition_of(j.layer->pages[0]);
    absl::StatusOr<std::vector<PageId>> reserved = cold_.Reserve(static_cast<int64_t>(from.size()), device);
    if (!reserved.ok()) {
      fail(j, reserved.status());
      continue;
    }
    cold[i] = *std::move(reserved);
    for (size_t t = 0; t < from.size(); ++t) moves.push_back(TierMove{from[t], cold[i][t], p});
  }
  absl::Status moved = moves.empty() ? absl::OkStatus() : backend_.DemotePages(moves);
  bool from_copies = false;  // the copies' gauge moves
  // The demoted bytes, as the backend holds them, must be the cold pages
  // the hot ones were promoted from.
  all.clear();
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].status.ok()) all.insert(all.end(), cold[i].begin(), cold[i].end());
  }
  if (moved.ok()) moved = verifier_.ColdSums(all, &sums);
  at = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    DemoteJob& j = jobs[i];
    if (!j.status.ok()) continue;
    const size_t k = j.kept.size(), c = cold[i].size();
    absl::Status st = moved;
    if (st.ok()) {
      st = verifier_.CheckColdSums(absl::MakeConstSpan(sums).subspan(at, c),
                                   absl::MakeConstSpan(j.layer->page_sums).subspan(k), k, j.name, kCheckDemote);
    }
    at += c;
    if (!st.ok()) {
      cold_.Free(cold[i]);
      fail(j, st);
      continue;
    }
    LayerState* layer = j.layer;
    const size_t n = layer->pages.size();
    hot_.Free(layer->pages);
    j.usage->AddBytes(MoveBytes(static_cast<int64_t>(n), /*to_hot=*/false));
    j.kept.insert(j.kept.end(), cold[i].begin(), cold[i].end());
    layer->pages = std::move(j.kept);
    j.kept.clear();
    layer->hot = false;
    layer->hot_sums.Clear();
    RemoveHot(layer->id);
    ++demotions_;
    pages_demoted_ += n;
    metrics_->tier_demotions[reason]->Increment();
    metrics_->tier_pages_moved[1]->Increment(static_cast<double>(n));
    if (k > 0) {
      pages_demoted_from_copies_ += k;
      metrics_->tier_pages_demoted_from_copies->Increment(static_cast<double>(k));
      from_copies = true;
    }
  }
  if (from_copies) PublishCopies();
}

bool HotTier::DemoteVictim(const Held& held, int device, absl::flat_hash_set<uint64_t>* tried) {
  for (;;) {
    SequencePtr seq;
    int index = 0;
    uint64_t id = 0;
    {
      absl::MutexLock lock(&hot_mu_);
      for (const auto& [ns, candidate] : LruLocked()) {
        if (held.layers.contains(candidate) || tried->contains(candidate)) continue;
        const Entry& e = hot_layers_.at(candidate);
        if (e.seq->device != device) continue;
        seq = e.seq;
        index = e.layer;
        id = candidate;
        break;
      }
    }
    if (seq == nullptr) return false;
    tried->insert(id);
    // Never block here: the caller may hold other layers' locks. A layer
    // in use is not idle anyway.
    const bool lock_seq = !held.sequences.contains(seq.get());
    if (lock_seq && !seq->mu.ReaderTryLock()) continue;
    bool demoted = false;
    LayerState& layer = seq->layers[index];
    if (!seq->released && layer.mu.TryLock()) {
      // A hot layer without pages holds nothing worth demoting.
      demoted = layer.hot && layer.id == id && !layer.pages.empty() &&
                DemoteLocked(&layer, seq->usage, LayerName{seq->id, index}, kDemoteBudget).ok();
      layer.mu.Unlock();
    }
    if (lock_seq) seq->mu.ReaderUnlock();
    if (demoted) return true;
  }
}

bool HotTier::DemoteIdle() {
  if (idle_seconds_ <= 0.0) return false;
  const int64_t cutoff = absl::ToUnixNanos(clock_() - absl::Seconds(idle_seconds_));
  std::vector<std::pair<SequencePtr, int>> idle;
  {
    absl::MutexLock lock(&hot_mu_);
    for (const auto& [ns, id] : LruLocked()) {
      if (ns >= cutoff) break;
      const Entry& e = hot_layers_.at(id);
      idle.emplace_back(e.seq, e.layer);
    }
  }
  // A sequence's idle layers together, so that their copies are checked
  // in one backend call; the sequence as a reader, then its layers as
  // writers in layer order (LOCK ORDER in handler.h).
  absl::flat_hash_map<Sequence*, size_t> group_of;
  std::vector<std::pair<SequencePtr, std::vector<int>>> groups;
  for (auto& [seq, index] : idle) {
    auto [it, added] = group_of.try_emplace(seq.get(), groups.size());
    if (added) groups.emplace_back(seq, std::vector<int>());
    groups[it->second].second.push_back(index);
  }
  for (auto& [seq, indices] : groups) {
    absl::ReaderMutexLock seq_lock(&seq->mu);
    if (seq->released) continue;
    std::sort(indices.begin(), indices.end());
    std::vector<LayerState*> locked, demote;
    std::vector<LayerName> names;
    for (int index : indices) {
      LayerState& layer = seq->layers[index];
      layer.mu.Lock();
      locked.push_back(&layer);
      if (!layer.hot) continue;
      {
        // Attended since the list was made?
        absl::MutexLock lock(&hot_mu_);
        auto it = hot_layers_.find(layer.id);
        if (it == hot_layers_.end() || it->second.attended_ns >= cutoff) continue;
      }
      demote.push_back(&layer);
      names.push_back(LayerName{seq->id, index});
    }
    std::vector<std::vector<PageId>> kept = TakeCopies(demote, names);
    std::vector<DemoteJob> jobs;
    for (size_t i = 0; i < demote.size(); ++i) {
      jobs.push_back(DemoteJob{demote[i], seq->usage, names[i], std::move(kept[i]), absl::OkStatus()});
    }
    // A layer that fails (no cold room) stays hot and is tried again later.
    DemoteTogetherLocked(absl::MakeSpan(jobs), kDemoteIdle);
    for (auto it = locked.rbegin(); it != locked.rend(); ++it) (*it)->mu.Unlock();
  }
  return !idle.empty();
}

}  // namespace driftkv
