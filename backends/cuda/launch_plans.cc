#include "backends/cuda/launch_plans.h"

#include <cstring>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace driftkv {
namespace cuda_backend {

uint64_t LaunchPlans::Describe(absl::Span<const AttendJob> jobs) {
  items_.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const AttendJob& j = jobs[i];
    Item& it = items_[i];
    it.window_id = j.window_id;
    it.window_first = j.window_first;
    it.window_tokens = j.window.tokens;
    it.query_dev = reinterpret_cast<uintptr_t>(j.query_dev);
    it.out_dev = reinterpret_cast<uintptr_t>(j.out_dev);
    it.lse_dev = reinterpret_cast<uintptr_t>(j.lse_dev);
    it.layer = j.layer;
    it.pages = static_cast<int64_t>(j.pages.size());
    it.q_heads = j.q_heads;
    it.flags = static_cast<int64_t>(j.query_dtype & 0xff) | static_cast<int64_t>(j.out_dtype & 0xff) << 8 |
               static_cast<int64_t>(j.hot) << 16 | static_cast<int64_t>(j.check_query) << 17;
  }
  return absl::HashOf(absl::string_view(reinterpret_cast<const char*>(items_.data()), items_.size() * sizeof(Item)));
}

bool LaunchPlans::PagesEqual(absl::Span<const AttendJob> jobs, const Entry& e) const {
  size_t at = 0;
  for (const AttendJob& j : jobs) {
    const size_t n = j.pages.size();
    if (at + n > e.pages.size()) return false;
    if (n > 0 && std::memcmp(j.pages.data(), e.pages.data() + at, n * sizeof(PageId)) != 0) return false;
    at += n;
  }
  return at == e.pages.size();
}

int LaunchPlans::Find(absl::Span<const AttendJob> jobs) {
  if (entries_.empty() || jobs.empty()) return -1;
  const uint64_t key = Describe(jobs);
  auto it = index_.find(key);
  if (it == index_.end()) return -1;
  Entry& e = entries_[it->second];
  if (e.items.size() != items_.size() ||
      std::memcmp(e.items.data(), items_.data(), items_.size() * sizeof(Item)) != 0 || !PagesEqual(jobs, e)) {
    return -1;
  }
  e.last_use = ++clock_;
  ++hits_;
  return it->second;
}

int LaunchPlans::Record(absl::Span<const AttendJob> jobs) {
  if (entries_.empty() || jobs.empty()) return -1;
  const uint64_t key = Describe(jobs);
  int e = -1;
  if (auto it = index_.find(key); it != index_.end()) {
    e = it->second;
  } else {
    for (int k = 0; k < capacity(); ++k) {
      if (!entries_[k].used) {
        e = k;
        break;
      }
      if (e < 0 || entries_[k].last_use < entries_[e].last_use) e = k;
    }
    if (entries_[e].used) index_.erase(entries_[e].key);
    index_[key] = e;
  }
  Entry& entry = entries_[e];
  entry.used = true;
  entry.key = key;
  entry.last_use = ++clock_;
  entry.items = items_;
  entry.pages.clear();
  for (const AttendJob& j : jobs) entry.pages.insert(entry.pages.end(), j.pages.begin(), j.pages.end());
  ++records_;
  return e;
}

void LaunchPlans::Clear() {
  for (Entry& e : entries_) e = Entry();
  index_.clear();
}

}  // namespace cuda_backend
}  // namespace driftkv
