// SpillTier (service/spill_tier.h).
#include "service/spill_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/page_checksum.h"
#include "service/quoted.h"

namespace driftkv {

absl::StatusOr<std::unique_ptr<SpillTier>> SpillTier::Create(const HostLevelOptions& host, const DiskLevelOptions& disk,
                                                             PagePool& pool, Metrics* metrics, Backend* backend,
                                                             bool keep_disk) {
  std::unique_ptr<SpillTier> t(new SpillTier(pool, metrics, backend));
  if (host.on()) {
    absl::StatusOr<std::unique_ptr<tiers::HostPageStore>> store =
        tiers::HostPageStore::Create(pool.page_stride(), host.budget_bytes);
    if (!store.ok()) {
      return absl::Status(store.status().code(),
                          absl::StrCat("host_level.budget_bytes ", host.budget_bytes, ": ", store.status().message()));
    }
    t->host_ = *std::move(store);
    if (absl::Status st = backend->PinHostRegion(t->host_->block(), t->host_->block_bytes()); !st.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("host_level.budget_bytes ", host.budget_bytes,
                                                       ": the backend could not page-lock it: ", st.message()));
    }
    t->metrics_[kHost].capacity_bytes->Set(static_cast<double>(t->host_->block_bytes()));
  }
  if (disk.on()) {
    tiers::DiskPageStoreOptions o;
    o.dir = disk.dir;
    o.page_bytes = pool.page_stride();
    o.budget_bytes = disk.budget_bytes;
    o.segment_bytes = disk.segment_bytes;
    o.durability = disk.power_loss ? tiers::Durability::kPowerLoss : tiers::Durability::kProcess;
    // Without a snapshot that names them, no sequence names the records of
    // a previous process.
    o.wipe_at_open = !keep_disk;
    o.io = disk.io;
    absl::StatusOr<std::unique_ptr<tiers::DiskPageStore>> store = tiers::DiskPageStore::Open(o);
    if (!store.ok()) {
      if (t->host_ != nullptr) backend->UnpinHostRegion(t->host_->block());
      return absl::Status(store.status().code(),
                          absl::StrCat("disk_level.dir \"", disk.dir, "\": ", store.status().message()));
    }
    t->store_ = *std::move(store);
    uint64_t last = 0;
    absl::MutexLock lock(&t->mu_);
    for (uint64_t key : t->store_->Keys()) {
      t->unclaimed_.insert(key);
      last = std::max(last, key);
    }
    t->next_key_.store(last + 1);  // keys of this process are new to the store
    t->metrics_[kDisk].capacity_bytes->Set(static_cast<double>(disk.budget_bytes));
  }
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
  if (host_ != nullptr) backend_.UnpinHostRegion(host_->block());
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

SpillTier::Pages SpillTier::PagesOf(Sequence* seq) {
  Pages where;
  for (LayerState& l : seq->layers) {
    for (size_t i = 0; i < l.pages.size(); ++i) where.push_back({&l, i});
  }
  return where;
}

namespace {
// Set while a Restore reserves its pool pages: the moves down that its
// Reserve causes may use the levels' swap room (SWAPS in the header).
thread_local bool t_restoring = false;
}  // namespace

int64_t SpillTier::SwapRoom(int64_t capacity) const {
  return t_restoring ? 0 : std::min(largest_.load(), capacity / 4);
}

bool SpillTier::DiskHasRoom(size_t pages) const {
  if (store_ == nullptr) return false;
  const uint64_t record = store_->record_bytes() + tiers::kFooterEntryBytes;
  const int64_t records = static_cast<int64_t>(store_->budget_bytes() / record);
  return store_->bytes_used() + (pages + static_cast<uint64_t>(SwapRoom(records))) * record <= store_->budget_bytes();
}

void SpillTier::NoteSize(size_t pages) {
  int64_t seen = largest_.load();
  while (static_cast<int64_t>(pages) > seen && !largest_.compare_exchange_weak(seen, static_cast<int64_t>(pages))) {
  }
}

int64_t SpillTier::MoveDownLocked(Sequence* seq) {
  // See PINS in the header: the hint first, then the pins.
  seq->below_hint.store(true);
  if (seq->spill_pins.load() != 0) {
    seq->below_hint.store(false);
    return 0;
  }
  for (LayerState& l : seq->layers) {
    if (l.hot) {  // level pages stay with the hot tier
      seq->below_hint.store(false);
      return 0;
    }
  }
  const Pages where = PagesOf(seq);
  if (where.empty()) {
    seq->below_hint.store(false);
    return 0;
  }
  const int64_t before = pool_.pages_in_use(seq->device);
  NoteSize(where.size());
  bool moved = false;
  if (host_ != nullptr && static_cast<size_t>(host_->capacity()) >= where.size()) {
    const int64_t wanted = static_cast<int64_t>(where.size()) + SwapRoom(host_->capacity());
    if (host_->free_slots() < wanted && store_ != nullptr) MakeHostRoom(wanted, seq);
    if (host_->free_slots() >= wanted) moved = PoolToHostLocked(seq, where);
  }
  if (!moved && DiskHasRoom(where.size())) moved = PoolToDiskLocked(seq, where);
  if (!moved) {
    seq->below_hint.store(false);
    return 0;
  }
  for (LayerState& l : seq->layers) {
    pool_.Free(l.pages);
    std::fill(l.pages.begin(), l.pages.end(), kPageBelow);
  }
  seq->below = true;
  // Pages other holders share (a fork, the prefix index) stay in use.
  return std::max<int64_t>(0, before - pool_.pages_in_use(seq->device));
}

bool SpillTier::PoolToHostLocked(Sequence* seq, const Pages& where) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<uint64_t>> slots = host_->Take(static_cast<int64_t>(where.size()));
  if (!slots.ok()) return false;
  std::vector<PageId> pages(where.size());
  std::vector<uint8_t*> dst(where.size());
  for (size_t j = 0; j < where.size(); ++j) {
    pages[j] = where[j].first->pages[where[j].second];
    dst[j] = host_->slot((*slots)[j]);
  }
  if (absl::Status st = backend_.PagesToHost(pool_, pages, dst); !st.ok()) {
    host_->Give(*slots);
    metrics_[kHost].move_failures[kMoveDown]->Increment();
    return false;
  }
  PlacedLocked(*seq, kHost, *std::move(slots), start);
  return true;
}

bool SpillTier::PoolToDiskLocked(Sequence* seq, const Pages& where) {
  const absl::Time start = absl::Now();
  std::vector<uint64_t> keys;
  if (!WriteToDisk(
          where, [&](size_t j) { return pool_.page(where[j].first->pages[where[j].second]); }, &keys)) {
    return false;
  }
  PlacedLocked(*seq, kDisk, std::move(keys), start);
  return true;
}

bool SpillTier::WriteToDisk(const Pages& where, const std::function<const uint8_t*(size_t)>& bytes,
                            std::vector<uint64_t>* keys) {
  keys->resize(where.size());
  for (uint64_t& k : *keys) k = next_key_.fetch_add(1);
  std::vector<absl::Status> done = RunAll(where.size(), [&](size_t j, tiers::DiskPageStore::Callback cb) {
    const auto [layer, i] = where[j];
    return store_->PutAsync((*keys)[j], bytes(j), layer->page_sums[i], std::move(cb));
  });
  bool ok = true;
  for (const absl::Status& st : done) ok = ok && st.ok();
  if (!ok) {
    // What was stored goes again; the pages stay where they were.
    absl::MutexLock lock(&mu_);
    for (size_t j = 0; j < done.size(); ++j) {
      if (done[j].ok()) to_erase_.push_back((*keys)[j]);
    }
    metrics_[kDisk].move_failures[kMoveDown]->Increment();
  }
  return ok;
}

void SpillTier::PlacedLocked(Sequence& seq, Where level, std::vector<uint64_t> keys, absl::Time start) {
  seq.below_keys = std::move(keys);
  seq.below_on_host = level == kHost;
  (level == kHost ? on_host_ : on_disk_).fetch_add(1);
  Counted(level, kMoveDown, seq.below_keys.size());
  metrics_[level].move_down_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
}

void SpillTier::DropBelowLocked(Sequence& seq) {
  if (seq.below_on_host) {
    host_->Give(seq.below_keys);
    on_host_.fetch_sub(1);
  } else {
    absl::MutexLock lock(&mu_);
    to_erase_.insert(to_erase_.end(), seq.below_keys.begin(), seq.below_keys.end());
    on_disk_.fetch_sub(1);
  }
  seq.below_keys.clear();
  seq.below_on_host = false;
}

bool SpillTier::MakeHostRoom(int64_t slots, const Sequence* mover) {
  std::vector<SequencePtr> on_host;
  {
    absl::MutexLock lock(&mu_);
    for (const std::weak_ptr<Sequence>& w : candidates_) {
      SequencePtr s = w.lock();
      if (s != nullptr && s.get() != mover && s->below_hint.load() && s->spill_pins.load() == 0) {
        on_host.push_back(std::move(s));
      }
    }
  }
  std::sort(on_host.begin(), on_host.end(), [](const SequencePtr& a, const SequencePtr& b) {
    return a->last_access_ns.load() < b->last_access_ns.load();
  });
  for (const SequencePtr& s : on_host) {
    if (host_->free_slots() >= slots) break;
    if (!s->mu.TryLock()) continue;
    // A pin taken after the list was made: its request restores under
    // this lock once it is released (PINS); the sequence must stay put.
    if (!s->released && s->below && s->below_on_host && s->spill_pins.load() == 0) HostToDiskLocked(s.get());
    s->mu.Unlock();
  }
  return host_->free_slots() >= slots;
}

bool SpillTier::HostToDiskLocked(Sequence* seq) {
  const absl::Time start = absl::Now();
  const Pages where = PagesOf(seq);  // layer-major, as the slots are
  if (!DiskHasRoom(where.size())) return false;
  // The disk store checks each page against its checksum as it takes it:
  // a slot corrupted in host memory is refused here, and the sequence
  // stays on the host level, where its restore reports DATA_LOSS.
  std::vector<uint64_t> keys;
  const uint64_t* slots = seq->below_keys.data();  // the lambda runs under this call's lock
  if (!WriteToDisk(
          where, [&](size_t j) { return host_->slot(slots[j]); }, &keys))
    return false;
  DropBelowLocked(*seq);
  PlacedLocked(*seq, kDisk, std::move(keys), start);
  return true;
}

absl::Status SpillTier::ReadBack(Sequence* seq, const Pages& where, const std::vector<PageId>& fresh,
                                 absl::string_view id) {
  const Where level = seq->below_on_host ? kHost : kDisk;
  std::vector<absl::Status> done(where.size());
  std::vector<PageChecksum> sums(where.size());
  absl::Status copy;  // a failure of the whole copy (host level)
  if (level == kHost) {
    std::vector<const uint8_t*> src(where.size());
    for (size_t j = 0; j < where.size(); ++j) src[j] = host_->slot(seq->below_keys[j]);
    copy = backend_.PagesFromHost(pool_, src, fresh, sums.data());
  } else {
    const uint64_t* records = seq->below_keys.data();  // the lambda runs under this call's lock
    done = RunAll(where.size(), [&](size_t j, tiers::DiskPageStore::Callback cb) {
      return store_->GetAsync(records[j], pool_.page(fresh[j]), std::move(cb));
    });
    // The disk store checked each record; the backend's copies are made
    // from the pool's bytes, summed as the backend holds them.
    bool ok = true;
    for (const absl::Status& st : done) ok = ok && st.ok();
    if (ok) copy = backend_.UploadPages(fresh);
    if (ok && copy.ok()) copy = backend_.ChecksumPages(pool_, fresh, sums.data());
  }
  if (!copy.ok()) {
    return absl::UnavailableError(absl::StrCat("sequence_id ", Quoted(id),
                                               ": its pages did not reach the backend from the ",
                                               level == kHost ? "host" : "disk", " level: ", copy.message()));
  }
  for (size_t j = 0; j < where.size(); ++j) {
    const auto [layer, i] = where[j];
    absl::Status st = done[j];
    if (st.ok() && sums[j] != layer->page_sums[i]) {
      st = absl::DataLossError("page checksum mismatch after the read; not served");
    }
    if (st.ok()) continue;
    if (st.code() == absl::StatusCode::kDataLoss) metrics_[level].checksum_failures->Increment();
    const int layer_index = static_cast<int>(layer - seq->layers.data());
    return absl::Status(
        st.code() == absl::StatusCode::kDataLoss ? st.code() : absl::StatusCode::kUnavailable,
        absl::StrCat("sequence_id ", Quoted(id), " layer ", layer_index, " page ", i, " (tokens [",
                     i * pool_.page_tokens(), ", ", (i + 1) * pool_.page_tokens(), ")) did not come back from the ",
                     level == kHost ? "host" : "disk", " level: ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status SpillTier::Restore(Sequence* seq, absl::string_view id, int64_t* restored) {
  if (!seq->below_hint.load()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&seq->mu);
  if (seq->released || !seq->below) return absl::OkStatus();
  const Pages where = PagesOf(seq);
  // May move other sequences down (this one is pinned and locked), into
  // the levels' swap room if need be.
  t_restoring = true;
  absl::StatusOr<std::vector<PageId>> reserved = pool_.Reserve(static_cast<int64_t>(where.size()), seq->device);
  const Where level = seq->below_on_host ? kHost : kDisk;
  t_restoring = false;
  if (!reserved.ok()) {
    metrics_[level].move_failures[kMoveUp]->Increment();
    return absl::ResourceExhaustedError(absl::StrCat(
        "sequence_id ", Quoted(id), " has ", where.size(), " pages on the ", level == kHost ? "host" : "disk",
        " level and the pool has no room for them: ", reserved.status().message()));
  }
  const std::vector<PageId>& fresh = *reserved;
  if (absl::Status st = ReadBack(seq, where, fresh, id); !st.ok()) {
    pool_.Free(fresh);
    metrics_[level].move_failures[kMoveUp]->Increment();
    Publish();
    return st;
  }
  for (size_t j = 0; j < where.size(); ++j) where[j].first->pages[where[j].second] = fresh[j];
  DropBelowLocked(*seq);
  seq->below = false;
  seq->below_hint.store(false);
  Counted(level, kMoveUp, where.size());
  metrics_[level].restore_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (restored != nullptr) *restored = static_cast<int64_t>(where.size());
  Publish();
  return absl::OkStatus();
}

void SpillTier::Forget(Sequence& seq) {
  DropBelowLocked(seq);
  seq.below = false;
  seq.below_hint.store(false);
  Publish();
}

void SpillTier::Counted(Where level, int direction, size_t pages) {
  metrics_[level].moved_pages[direction]->Increment(static_cast<double>(pages));
  metrics_[level].moved_bytes[direction]->Increment(static_cast<double>(pages * pool_.page_stride()));
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
  if (host_ != nullptr) {
    const int64_t used = host_->in_use();
    metrics_[kHost].pages->Set(static_cast<double>(used));
    metrics_[kHost].bytes->Set(static_cast<double>(used) * static_cast<double>(host_->page_bytes()));
    metrics_[kHost].sequences->Set(static_cast<double>(on_host_.load()));
  }
  if (store_ != nullptr) {
    const tiers::DiskPageStoreStats s = store_->stats();
    metrics_[kDisk].pages->Set(static_cast<double>(s.pages));
    metrics_[kDisk].bytes->Set(static_cast<double>(s.bytes_used));
    metrics_[kDisk].sequences->Set(static_cast<double>(on_disk_.load()));
  }
}

void SpillTier::EraseLoop() {
  for (;;) {
    std::vector<uint64_t> keys;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SpillTier* t)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->stop_ || (!t->frozen_ && !t->to_erase_.empty()); },
          this));
      // Stopping: what is left stays on disk, for the next start.
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
      +[](SpillTier* t)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return (t->frozen_ || t->to_erase_.empty()) && t->erasing_ == 0; },
      this));
}

void SpillTier::Freeze() {
  absl::MutexLock lock(&mu_);
  frozen_ = true;
  // An erase already taken by the eraser is of a record no sequence names
  // any more; it finishes, nothing after it starts.
  mu_.Await(absl::Condition(
      +[](SpillTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->erasing_ == 0; }, this));
}

absl::StatusOr<uint64_t> SpillTier::TakeHostSlot() {
  if (host_ == nullptr) return absl::FailedPreconditionError("this server has no host level");
  absl::StatusOr<std::vector<uint64_t>> one = host_->Take(1);
  if (!one.ok()) return one.status();
  return (*one)[0];
}

void SpillTier::AdoptBelow(Sequence& seq, bool on_host, std::vector<uint64_t> keys) {
  if (!on_host) {
    absl::MutexLock lock(&mu_);
    for (uint64_t key : keys) unclaimed_.erase(key);
  }
  seq.below_keys = std::move(keys);
  seq.below_on_host = on_host;
  seq.below = true;
  NoteSize(seq.below_keys.size());
  seq.below_hint.store(true);
  (on_host ? on_host_ : on_disk_).fetch_add(1);
  Publish();
}

int64_t SpillTier::EraseUnclaimed() {
  absl::MutexLock lock(&mu_);
  const int64_t n = static_cast<int64_t>(unclaimed_.size());
  to_erase_.insert(to_erase_.end(), unclaimed_.begin(), unclaimed_.end());
  unclaimed_.clear();
  return n;
}

}  // namespace driftkv
