// SpillTier (service/spill_tier.h).
#include "service/spill_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/page_checksum.h"
#include "service/quoted.h"

namespace driftkv {

absl::StatusOr<std::unique_ptr<SpillTier>> SpillTier::Create(const DiskLevelOptions& options, PagePool& pool,
                                                             Metrics* metrics, Upload upload) {
  tiers::DiskPageStoreOptions o;
  o.dir = options.dir;
  o.page_bytes = pool.page_stride();
  o.budget_bytes = options.budget_bytes;
  o.segment_bytes = options.segment_bytes;
  o.durability = options.power_loss ? tiers::Durability::kPowerLoss : tiers::Durability::kProcess;
  o.wipe_at_open = true;  // the pages of a previous process's sequences: no sequence names them
  o.io = options.io;
  absl::StatusOr<std::unique_ptr<tiers::DiskPageStore>> store = tiers::DiskPageStore::Open(o);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("disk_level.dir \"", options.dir, "\": ", store.status().message()));
  }
  std::unique_ptr<SpillTier> t(new SpillTier(pool, metrics, std::move(upload)));
  t->store_ = *std::move(store);
  t->metrics_.capacity_bytes->Set(static_cast<double>(options.budget_bytes));
  t->eraser_ = std::thread([self = t.get()] { self->EraseLoop(); });
  t->Publish();
  return t;
}

SpillTier::~SpillTier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  eraser_.join();
}

void SpillTier::Track(const SequencePtr& seq) {
  absl::MutexLock lock(&mu_);
  candidates_.push_back(seq);
}

int64_t SpillTier::MoveDown(int64_t pages, int partition) {
  std::vector<SequencePtr> victims;
  {
    absl::MutexLock lock(&mu_);
    size_t out = 0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      SequencePtr s = candidates_[i].lock();
      if (s == nullptr) continue;  // gone: dropped from the list
      candidates_[out++] = candidates_[i];
      if (s->device == partition && s->spill_pins.load() == 0 && !s->below_hint.load()) victims.push_back(std::move(s));
    }
    candidates_.resize(out);
  }
  std::sort(victims.begin(), victims.end(), [](const SequencePtr& a, const SequencePtr& b) {
    return a->last_access_ns.load() < b->last_access_ns.load();
  });
  int64_t freed = 0;
  for (const SequencePtr& s : victims) {
    if (freed >= pages) break;
    // Never waits: a held lock means someone uses the sequence right now.
    if (!s->mu.TryLock()) continue;
    if (!s->released && !s->below) freed += MoveDownLocked(s.get());
    s->mu.Unlock();
  }
  Publish();
  return freed;
}

int64_t SpillTier::MoveDownLocked(Sequence* seq) {
  // See PINS in the header: the hint first, then the pins.
  seq->below_hint.store(true);
  if (seq->spill_pins.load() != 0) {
    seq->below_hint.store(false);
    return 0;
  }
  std::vector<std::pair<LayerState*, size_t>> where;  // every page: its layer and index
  for (LayerState& l : seq->layers) {
    if (l.hot) {  // level pages stay with the hot tier
      seq->below_hint.store(false);
      return 0;
    }
    for (size_t i = 0; i < l.pages.size(); ++i) where.push_back({&l, i});
  }
  const uint64_t record = tiers::RecordBytes(pool_.page_stride()) + tiers::kFooterEntryBytes;
  if (where.empty() || store_->bytes_used() + where.size() * record > store_->budget_bytes()) {
    seq->below_hint.store(false);
    return 0;
  }
  std::vector<uint64_t> keys(where.size());
  for (uint64_t& k : keys) k = next_key_.fetch_add(1);
  std::vector<absl::Status> done = RunAll(where.size(), [&](size_t j, tiers::DiskPageStore::Callback cb) {
    const auto [layer, i] = where[j];
    return store_->PutAsync(keys[j], pool_.page(layer->pages[i]), layer->page_sums[i], std::move(cb));
  });
  bool ok = true;
  for (const absl::Status& st : done) ok = ok && st.ok();
  if (!ok) {
    // What was stored goes again; the sequence stays in the pool.
    absl::MutexLock lock(&mu_);
    for (size_t j = 0; j < done.size(); ++j) {
      if (done[j].ok()) to_erase_.push_back(keys[j]);
    }
    metrics_.move_failures[kMoveDown]->Increment();
    seq->below_hint.store(false);
    return 0;
  }
  const int64_t before = pool_.pages_in_use(seq->device);
  for (LayerState& l : seq->layers) {
    pool_.Free(l.pages);
    std::fill(l.pages.begin(), l.pages.end(), kPageBelow);
  }
  seq->below_keys = std::move(keys);
  seq->below = true;
  sequences_below_.fetch_add(1);
  metrics_.moved_pages[kMoveDown]->Increment(static_cast<double>(where.size()));
  metrics_.moved_bytes[kMoveDown]->Increment(static_cast<double>(where.size() * pool_.page_stride()));
  // Pages other holders share (a fork, the prefix index) stay in use.
  return std::max<int64_t>(0, before - pool_.pages_in_use(seq->device));
}

absl::Status SpillTier::Restore(Sequence* seq, absl::string_view id, int64_t* restored) {
  if (!seq->below_hint.load()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&seq->mu);
  if (seq->released || !seq->below) return absl::OkStatus();
  std::vector<std::pair<LayerState*, size_t>> where;
  for (LayerState& l : seq->layers) {
    for (size_t i = 0; i < l.pages.size(); ++i) where.push_back({&l, i});
  }
  // May move other sequences down (this one is pinned and locked).
  absl::StatusOr<std::vector<PageId>> reserved = pool_.Reserve(static_cast<int64_t>(where.size()), seq->device);
  if (!reserved.ok()) {
    metrics_.move_failures[kMoveUp]->Increment();
    return absl::ResourceExhaustedError(
        absl::StrCat("sequence_id ", Quoted(id), " has ", where.size(),
                     " pages on the disk level and the pool has no room for them: ", reserved.status().message()));
  }
  const std::vector<PageId>& fresh = *reserved;
  std::vector<absl::Status> done = RunAll(where.size(), [&](size_t j, tiers::DiskPageStore::Callback cb) {
    return store_->GetAsync(seq->below_keys[j], pool_.page(fresh[j]), std::move(cb));
  });
  absl::Status failed;
  for (size_t j = 0; j < where.size() && failed.ok(); ++j) {
    const auto [layer, i] = where[j];
    const int layer_index = static_cast<int>(layer - seq->layers.data());
    absl::Status st = done[j];
    if (st.ok() && Crc32c(pool_.page(fresh[j]), pool_.page_stride()) != layer->page_sums[i]) {
      st = absl::DataLossError("page checksum mismatch in the pool after the read; not served");
    }
    if (!st.ok()) {
      if (st.code() == absl::StatusCode::kDataLoss) metrics_.checksum_failures->Increment();
      failed = absl::Status(st.code() == absl::StatusCode::kDataLoss ? st.code() : absl::StatusCode::kUnavailable,
                            absl::StrCat("sequence_id ", Quoted(id), " layer ", layer_index, " page ", i, " (tokens [",
                                         i * pool_.page_tokens(), ", ", (i + 1) * pool_.page_tokens(),
                                         ")) did not come back from the disk level: ", st.message()));
    }
  }
  if (failed.ok() && upload_) {
    // Checked in the pool first: the backend's copies are made from
    // intact bytes only.
    if (absl::Status st = upload_(fresh); !st.ok()) {
      failed = absl::UnavailableError(absl::StrCat("sequence_id ", Quoted(id),
                                                   ": its pages came back from the disk "
                                                   "level but did not reach the backend: ",
                                                   st.message()));
    }
  }
  if (!failed.ok()) {
    pool_.Free(fresh);
    metrics_.move_failures[kMoveUp]->Increment();
    Publish();
    return failed;
  }
  for (size_t j = 0; j < where.size(); ++j) where[j].first->pages[where[j].second] = fresh[j];
  {
    absl::MutexLock erase_lock(&mu_);
    to_erase_.insert(to_erase_.end(), seq->below_keys.begin(), seq->below_keys.end());
  }
  seq->below_keys.clear();
  seq->below = false;
  seq->below_hint.store(false);
  sequences_below_.fetch_sub(1);
  metrics_.moved_pages[kMoveUp]->Increment(static_cast<double>(where.size()));
  metrics_.moved_bytes[kMoveUp]->Increment(static_cast<double>(where.size() * pool_.page_stride()));
  metrics_.restore_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (restored != nullptr) *restored = static_cast<int64_t>(where.size());
  Publish();
  return absl::OkStatus();
}

void SpillTier::Forget(Sequence& seq) {
  {
    absl::MutexLock lock(&mu_);
    to_erase_.insert(to_erase_.end(), seq.below_keys.begin(), seq.below_keys.end());
  }
  seq.below_keys.clear();
  seq.below = false;
  seq.below_hint.store(false);
  sequences_below_.fetch_sub(1);
}

std::vector<absl::Status> SpillTier::RunAll(
    size_t jobs, const std::function<absl::Status(size_t, tiers::DiskPageStore::Callback)>& submit) {
  struct Wait {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<absl::Status> status ABSL_GUARDED_BY(mu);
  } wait;
  {
    absl::MutexLock lock(&wait.mu);
    wait.left = jobs;
    wait.status.resize(jobs);
  }
  for (size_t j = 0; j < jobs; ++j) {
    absl::Status st = submit(j, [&wait, j](absl::Status s) {
      absl::MutexLock lock(&wait.mu);
      wait.status[j] = std::move(s);
      --wait.left;
    });
    if (!st.ok()) {  // nothing queued: the callback will not run
      absl::MutexLock lock(&wait.mu);
      wait.status[j] = std::move(st);
      --wait.left;
    }
  }
  absl::MutexLock lock(&wait.mu);
  wait.mu.Await(absl::Condition(
      +[](size_t* left) { return *left == 0; }, &wait.left));
  return std::move(wait.status);
}

void SpillTier::Publish() {
  const tiers::DiskPageStoreStats s = store_->stats();
  metrics_.pages->Set(static_cast<double>(s.pages));
  metrics_.bytes->Set(static_cast<double>(s.bytes_used));
  metrics_.sequences->Set(static_cast<double>(sequences_below_.load()));
}

void SpillTier::EraseLoop() {
  for (;;) {
    std::vector<uint64_t> keys;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SpillTier* t) { return t->stop_ || !t->to_erase_.empty(); }, this));
      // Stopping: what is left stays on disk, wiped at the next start.
      if (stop_) return;
      keys.assign(to_erase_.begin(), to_erase_.end());
      to_erase_.clear();
      erasing_ = static_cast<int>(keys.size());
    }
    // An erase that fails forgets the key all the same (the store's rule);
    // the wipe at the next start removes what it left.
    for (uint64_t k : keys) store_->Erase(k).IgnoreError();
    {
      absl::MutexLock lock(&mu_);
      erasing_ = 0;
    }
    Publish();
  }
}

void SpillTier::DrainErases() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](SpillTier* t) { return t->to_erase_.empty() && t->erasing_ == 0; }, this));
}

}  // namespace driftkv
