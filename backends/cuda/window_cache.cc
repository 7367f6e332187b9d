#include "backends/cuda/window_cache.h"

#include <algorithm>
#include <utility>

#include "kernels/attention.h"

namespace driftkv {
namespace cuda_backend {

absl::Status WindowCache::Init(size_t bytes, int n) {
  slot_bytes_ = static_cast<size_t>(gpu::kMaxWindow) * n * 2;
  const int slots = static_cast<int>(std::min<size_t>(bytes / (2 * slot_bytes_), 1 << 16));
  if (slots == 0) return absl::OkStatus();
  absl::Status st = keys_.Reserve(slots * slot_bytes_);
  if (st.ok()) st = values_.Reserve(slots * slot_bytes_);
  if (!st.ok()) return st;
  slots_.assign(slots, Slot());
  ResetFree();
  return absl::OkStatus();
}

void WindowCache::ResetFree() {
  free_.resize(slots_.size());
  for (size_t k = 0; k < free_.size(); ++k) free_[k] = static_cast<int>(free_.size() - 1 - k);
}

void WindowCache::Invalidate() {
  for (Slot& w : slots_) w = Slot();
  index_.clear();
  ResetFree();
}

bool WindowCache::Keep(absl::Span<const AttendJob> jobs, absl::Span<const int> slot_of) {
  if (slots_.empty() || slot_of.size() != jobs.size()) return false;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const AttendJob& j = jobs[i];
    if (j.window.tokens == 0) continue;
    const int slot = slot_of[i];
    if (slot < 0 || slot >= static_cast<int>(slots_.size())) return false;
    const Slot& w = slots_[slot];
    if (j.window_id == 0 || w.id != j.window_id || w.first != j.window_first || w.tokens != j.window.tokens) {
      return false;
    }
  }
  ++launch_;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].window.tokens > 0) slots_[slot_of[i]].last_use = launch_;
  }
  return true;
}

bool WindowCache::Plan(absl::Span<const AttendJob> jobs, std::vector<int>* slot_of, std::vector<Upload>* uploads) {
  if (slots_.empty()) return false;
  ++launch_;
  const int items = static_cast<int>(jobs.size());
  slot_of->assign(items, -1);
  uploads->clear();
  std::vector<std::pair<int, Slot>>& commits = commits_;
  absl::flat_hash_map<uint64_t, size_t>& taken = taken_;  // window id -> its entry in commits
  commits.clear();
  taken.clear();
  for (int i = 0; i < items; ++i) {
    const AttendJob& j = jobs[i];
    if (j.window.tokens == 0) continue;
    if (j.window_id == 0) return false;
    if (auto t = taken.find(j.window_id); t != taken.end()) {
      // Two items of one (sequence, layer) in one launch: the handler
      // holds the layer's read lock for both, so they see one window.
      const auto& [slot, w] = commits[t->second];
      if (w.first != j.window_first || w.tokens != j.window.tokens) return false;
      (*slot_of)[i] = slot;
      continue;
    }
    int slot = -1;
    if (auto it = index_.find(j.window_id); it != index_.end()) {
      slot = it->second;
      const Slot& w = slots_[slot];
      if (w.first == j.window_first && w.tokens <= j.window.tokens) {
        if (j.window.tokens > w.tokens) uploads->push_back({i, slot, w.tokens, j.window.tokens - w.tokens});
      } else {
        uploads->push_back({i, slot, 0, j.window.tokens});
      }
    } else {
      // A free slot, else the least recently used one; never one this
      // launch has already taken. Slots are free until first used (or
      // after Invalidate), so a launch of new windows does not scan every
      // slot for each of them.
      if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
      } else {
        for (size_t k = 0; k < slots_.size(); ++k) {
          const Slot& w = slots_[k];
          if (w.last_use == launch_) continue;
          if (slot < 0 || (w.id == 0) > (slots_[slot].id == 0) ||
              ((w.id == 0) == (slots_[slot].id == 0) && w.last_use < slots_[slot].last_use)) {
            slot = static_cast<int>(k);
          }
        }
      }
      if (slot < 0) return false;
      if (slots_[slot].id != 0) index_.erase(slots_[slot].id);
      slots_[slot] = Slot();
      uploads->push_back({i, slot, 0, j.window.tokens});
    }
    slots_[slot].last_use = launch_;
    taken[j.window_id] = commits.size();
    commits.push_back({slot, Slot{j.window_id, j.window_first, j.window.tokens, launch_}});
    (*slot_of)[i] = slot;
  }
  for (const auto& [slot, w] : commits) {
    slots_[slot] = w;
    index_[w.id] = slot;
  }
  return true;
}

}  // namespace cuda_backend
}  // namespace driftkv
