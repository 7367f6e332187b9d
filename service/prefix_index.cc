#include "service/prefix_index.h"

#include <algorithm>
#include <utility>

namespace driftkv {

PrefixIndex::~PrefixIndex() {
  absl::MutexLock lock(&mu_);
  std::vector<PageId> held;
  for (Slot* s = head_; s != nullptr; s = s->next) held.push_back(s->page);
  pool_.Free(held);
}

void PrefixIndex::Unlink(Slot* s) {
  (s->prev != nullptr ? s->prev->next : head_) = s->next;
  (s->next != nullptr ? s->next->prev : tail_) = s->prev;
  s->prev = s->next = nullptr;
}

void PrefixIndex::PushFront(Slot* s) {
  s->prev = nullptr;
  s->next = head_;
  (head_ != nullptr ? head_->prev : tail_) = s;
  head_ = s;
}

void PrefixIndex::Insert(const PageKey& ns, int layer, const PageKey& parent, absl::Span<const PageKey> keys,
                         std::vector<Page> pages) {
  std::vector<PageId> duplicates;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < pages.size(); ++i) {
      // The root is every first page's parent: it says nothing.
      const PageKey& before = i == 0 ? parent : keys[i - 1];
      if (!(before == PageKeyRoot())) {
        if (parents_.size() >= kRemembered) parents_.clear();
        parents_.insert(NodeKey{ns, before});
      }
      auto [it, created] = map_.try_emplace(NodeKey{ns, keys[i]});
      Node& node = it->second;
      if (created) {
        ++namespaces_[keys[i]];
        node.slots.resize(layers_);
        for (int l = 0; l < layers_; ++l) {
          node.slots[l].key = &it->first;
          node.slots[l].layer = l;
        }
      }
      Slot& s = node.slots[layer];
      if (s.page >= 0) {
        duplicates.push_back(pages[i].page);
        Unlink(&s);
      } else {
        s.page = pages[i].page;
        s.sum = pages[i].sum;
        s.digests = std::move(pages[i].digests);
        ++node.held;
        ++entries_;
        if (events_ != nullptr) events_->Publish(ns, PageEvents::Event{true, layer, keys[i]});
      }
      PushFront(&s);
    }
  }
  pool_.Free(duplicates);
}

std::vector<PrefixIndex::Entry> PrefixIndex::Entries() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  out.reserve(static_cast<size_t>(entries_));
  for (const Slot* s = tail_; s != nullptr; s = s->prev) {
    out.push_back(Entry{s->key->ns, s->key->key, s->layer, Page{s->page, s->sum, s->digests}});
  }
  return out;
}

void PrefixIndex::MarkUnhashed(const PageKey& ns, const PageKey& parent) {
  // Every prompt's first page has the root for parent: a mark there would
  // say nothing about any one prompt.
  if (parent == PageKeyRoot()) return;
  absl::MutexLock lock(&mu_);
  if (unhashed_.size() >= kRemembered) unhashed_.clear();
  unhashed_.insert(NodeKey{ns, parent});
}

void PrefixIndex::LookupLocked(const PageKey& ns, absl::Span<const PageKey> keys, Match* m,
                               std::vector<const Node*>* nodes) const {
  m->layer_pages.assign(layers_, 0);
  nodes->clear();
  // Page i extends layer l's prefix when every page before it did.
  int64_t running = layers_;  // layers whose prefix reaches page i
  for (size_t i = 0; i < keys.size() && running > 0; ++i) {
    auto it = map_.find(NodeKey{ns, keys[i]});
    if (it == map_.end()) break;
    nodes->push_back(&it->second);
    running = 0;
    for (int l = 0; l < layers_; ++l) {
      if (m->layer_pages[l] == static_cast<int64_t>(i) && it->second.slots[l].page >= 0) {
        ++m->layer_pages[l];
        ++running;
      }
    }
  }
  m->pages = *std::min_element(m->layer_pages.begin(), m->layer_pages.end());
  if (m->pages == static_cast<int64_t>(keys.size())) {
    m->miss = Miss::kNone;
    m->miss_layer = 0;
    return;
  }
  m->miss_layer =
      static_cast<int>(std::find(m->layer_pages.begin(), m->layer_pages.end(), m->pages) - m->layer_pages.begin());
  const NodeKey missing{ns, keys[m->pages]};
  const NodeKey after{ns, m->pages == 0 ? PageKeyRoot() : keys[m->pages - 1]};
  const bool in_namespace = map_.contains(missing);
  if (evicted_.contains(EvictedKey{missing, m->miss_layer})) {
    m->miss = Miss::kEvicted;
  } else if (unhashed_.contains(after)) {
    m->miss = Miss::kUnhashed;
  } else if (!in_namespace && m->pages > 0 && parents_.contains(after)) {
    m->miss = Miss::kDiverged;
  } else if (!in_namespace && namespaces_.contains(missing.key)) {
    m->miss = Miss::kOtherNamespace;
  } else {
    m->miss = Miss::kNeverStored;
  }
}

void PrefixIndex::Lookup(const PageKey& ns, absl::Span<const PageKey> keys, Match* match) const {
  thread_local std::vector<const Node*> nodes;  // no allocation per call once grown
  absl::ReaderMutexLock lock(&mu_);
  LookupLocked(ns, keys, match, &nodes);
}

int64_t PrefixIndex::Take(const PageKey& ns, absl::Span<const PageKey> keys, int64_t max_pages, Taken* taken,
                          Match* match) {
  std::vector<const Node*> nodes;
  absl::MutexLock lock(&mu_);
  LookupLocked(ns, keys, match, &nodes);
  int64_t k = std::min(match->pages, max_pages);
  if (k == 0) return 0;
  // A sequence's pages all lie in its partition (device slot).
  taken->partition = pool_.partition_of(nodes[0]->slots[0].page);
  for (int64_t i = 0; i < k; ++i) {
    for (int l = 0; l < layers_; ++l) {
      if (pool_.partition_of(nodes[i]->slots[l].page) != taken->partition) {
        k = i;
        break;
      }
    }
  }
  taken->pages.assign(layers_, {});
  taken->sums.assign(layers_, {});
  taken->digests.assign(layers_, {});
  std::vector<PageId> all;
  all.reserve(k * layers_);
  for (int l = 0; l < layers_; ++l) {
    taken->pages[l].reserve(k);
    taken->sums[l].reserve(k);
    for (int64_t i = 0; i < k; ++i) {
      Slot* s = const_cast<Slot*>(&nodes[i]->slots[l]);
      taken->pages[l].push_back(s->page);
      taken->sums[l].push_back(s->sum);
      taken->digests[l].insert(taken->digests[l].end(), s->digests.begin(), s->digests.end());
      all.push_back(s->page);
      Unlink(s);
      PushFront(s);
    }
  }
  pool_.Retain(all);
  return k;
}

void PrefixIndex::DropSlot(Slot* s) {
  Unlink(s);
  s->page = -1;
  s->digests.clear();
  s->digests.shrink_to_fit();
  --entries_;
  const NodeKey key = *s->key;
  if (evicted_.size() >= kRemembered) evicted_.clear();
  evicted_.insert(EvictedKey{key, s->layer});
  ++evictions_;
  if (events_ != nullptr) events_->Publish(key.ns, PageEvents::Event{false, s->layer, key.key});
  auto it = map_.find(key);
  if (--it->second.held == 0) {
    map_.erase(it);
    auto n = namespaces_.find(key.key);
    if (--n->second == 0) namespaces_.erase(n);
  }
}

int64_t PrefixIndex::EvictLocked(int64_t pages, int partition) {
  int64_t freed = 0, steps = entries_;
  Slot* s = tail_;
  while (s != nullptr && freed < pages && steps-- > 0) {
    Slot* more_recent = s->prev;
    if (partition < 0 || pool_.partition_of(s->page) == partition) {
      if (pool_.FreeIfLast(s->page)) {
        DropSlot(s);
        ++freed;
      } else {
        // A sequence holds it: not a candidate until that changes.
        Unlink(s);
        PushFront(s);
      }
    }
    s = more_recent;
  }
  return freed;
}

int64_t PrefixIndex::Evict(int64_t pages, int partition) {
  absl::MutexLock lock(&mu_);
  return EvictLocked(pages, partition);
}

int64_t PrefixIndex::EvictAll() {
  absl::MutexLock lock(&mu_);
  return EvictLocked(entries_, -1);
}

int64_t PrefixIndex::entries() const {
  absl::ReaderMutexLock lock(&mu_);
  return entries_;
}

uint64_t PrefixIndex::evictions() const {
  absl::ReaderMutexLock lock(&mu_);
  return evictions_;
}

}  // namespace driftkv
