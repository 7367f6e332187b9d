// SequenceTable (service/sequence_table.h).
#include "service/sequence_table.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/quoted.h"

namespace driftkv {

SequenceTable::SequenceTable(const ServiceOptions& options, int n, PagePool& pool, HotTier* hot, Metrics* metrics,
                             ServiceClock clock, std::vector<int> device_ids)
    : options_(options),
      n_(n),
      pool_(pool),
      hot_(hot),
      metrics_(metrics),
      clock_(std::move(clock)),
      device_ids_(std::move(device_ids)),
      ledger_([&options](const std::string& tenant) { return options.QuotaOf(tenant); }),
      tombstones_(absl::Seconds(options.tombstone_seconds)) {
  {
    absl::MutexLock lock(&mu_);
    device_sequences_.assign(pool_.partitions(), 0);
  }
  for (size_t k = 0; k < device_ids_.size(); ++k) {
    const std::map<std::string, std::string> label = {{"device", std::to_string(device_ids_[k])}};
    const int slot = static_cast<int>(k);
    metrics_->device_capacity_pages->Add(label).Set(
        static_cast<double>(pool_.partition_begin(slot + 1) - pool_.partition_begin(slot)));
    device_used_gauges_.push_back(&metrics_->device_pages_in_use->Add(label));
    device_sequence_gauges_.push_back(&metrics_->device_sequences->Add(label));
    if (hot_ != nullptr) {
      const PagePool& h = hot_->pool();
      metrics_->device_hot_capacity_pages->Add(label).Set(
          static_cast<double>(h.partition_begin(slot + 1) - h.partition_begin(slot)));
      device_hot_used_gauges_.push_back(&metrics_->device_hot_pages_in_use->Add(label));
    }
  }
}

SequencePtr SequenceTable::Find(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(key);
  return it == table_.end() ? nullptr : it->second;
}

void SequenceTable::FindAll(absl::string_view tenant, absl::Span<const absl::string_view> ids,
                            std::vector<SequencePtr>* out) const {
  out->clear();
  out->reserve(ids.size());
  absl::MutexLock lock(&mu_);
  for (absl::string_view id : ids) {
    auto it = table_.find(TenantKey(tenant, id));
    out->push_back(it == table_.end() ? nullptr : it->second);
  }
}

absl::Status SequenceTable::CheckTombstone(const std::string& key, const std::string& id) const {
  absl::Status st = tombstones_.CheckAppend(key, id, clock_());
  if (!st.ok()) metrics_->integrity_rejections[kRejectTombstone]->Increment();
  return st;
}

absl::StatusOr<SequencePtr> SequenceTable::FindOrCreate(const std::string& key, const std::string& id,
                                                        const std::string& tenant, bool new_incarnation,
                                                        bool* created) {
  TenantUsage* usage = ledger_.Get(tenant);
  absl::MutexLock lock(&mu_);
  *created = false;
  auto it = table_.find(key);
  if (it != table_.end()) return it->second;
  if (absl::Status st = AdmitLocked(key, id, usage, new_incarnation, /*charge=*/true); !st.ok()) return st;
  const int device = LeastLoadedDevice();
  ++device_sequences_[device];
  auto seq = std::make_shared<Sequence>(key, options_.layers, usage, device);
  Touch(seq.get());
  table_.emplace(key, seq);
  if (spill_.entered) spill_.entered(seq);
  *created = true;
  return seq;
}

absl::Status SequenceTable::AdmitLocked(const std::string& key, const std::string& id, TenantUsage* usage,
                                        bool new_incarnation, bool charge) const {
  if (draining_.load()) {
    return absl::UnavailableError(absl::StrCat("server is draining (shutting down for a restart): new sequence_id ",
                                               Quoted(id),
                                               " refused; existing sequences are served until the "
                                               "drain ends; create it on another replica or after the restart"));
  }
  if (!new_incarnation) {
    if (absl::Status st = CheckTombstone(key, id); !st.ok()) return st;
  }
  if (table_.size() >= options_.max_sequences) {
    return absl::ResourceExhaustedError(absl::StrCat("max_sequences ", options_.max_sequences,
                                                     " reached; cannot create sequence_id ", Quoted(id),
                                                     "; release sequences or raise max_sequences"));
  }
  absl::Status st = charge ? usage->ChargeSequence() : usage->CheckSequence();
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(st.message(), "; cannot create sequence_id ", Quoted(id)));
  return absl::OkStatus();
}

namespace {

absl::Status Exists(const std::string& id) {
  return absl::AlreadyExistsError(
      absl::StrCat("sequence_id ", Quoted(id), " already exists; fork into a new id, or release it first"));
}

}  // namespace

absl::Status SequenceTable::CheckNew(const std::string& key, const std::string& id, TenantUsage* usage,
                                     bool new_incarnation) const {
  absl::MutexLock lock(&mu_);
  if (table_.contains(key)) return Exists(id);
  return AdmitLocked(key, id, usage, new_incarnation, /*charge=*/false);
}

absl::Status SequenceTable::Insert(const SequencePtr& seq, const std::string& id, bool new_incarnation) {
  absl::MutexLock lock(&mu_);
  if (table_.contains(seq->id)) return Exists(id);
  if (absl::Status st = AdmitLocked(seq->id, id, seq->usage, new_incarnation, /*charge=*/true); !st.ok()) return st;
  ++device_sequences_[seq->device];
  Touch(seq.get());
  table_.emplace(seq->id, seq);
  if (spill_.entered) spill_.entered(seq);
  if (new_incarnation) tombstones_.Erase(seq->id);
  return absl::OkStatus();
}

int SequenceTable::LeastLoadedDevice() const {
  // A device's pages in both tiers: a promoted layer leaves the cold pool
  // (its cold copies, a cache taken back on demand, are not load) but
  // still holds a level page for each cold page it had.
  auto load = [this](int k) {
    return pool_.pages_in_use(k) + (hot_ != nullptr ? hot_->pool().pages_in_use(k) - hot_->cold_copy_pages(k) : 0);
  };
  int device = 0;
  for (int k = 1; k < pool_.partitions(); ++k) {
    const int64_t pk = load(k), pd = load(device);
    if (pk < pd || (pk == pd && device_sequences_[k] < device_sequences_[device])) device = k;
  }
  return device;
}

void SequenceTable::EraseLocked(Map::iterator it) {
  --device_sequences_[it->second->device];
  it->second->usage->RefundSequence();
  table_.erase(it);
}

void SequenceTable::DropIfEmpty(const SequencePtr& seq) {
  absl::MutexLock table_lock(&mu_);
  absl::MutexLock lock(&seq->mu);
  if (seq->released) return;
  for (const LayerState& l : seq->layers) {
    if (l.length != 0) return;
  }
  auto it = table_.find(seq->id);
  if (it != table_.end() && it->second == seq) EraseLocked(it);
  seq->released = true;
}

HeldBytes SequenceTable::BytesOf(const LayerState& l) const {
  HeldBytes b;
  const int64_t pages = static_cast<int64_t>(l.pages.size());
  if (l.hot) {
    b.hot_pages = pages * static_cast<int64_t>(hot_->pool().page_stride());
  } else {
    b.cold_pages = pages * static_cast<int64_t>(pool_.page_stride());
  }
  b.windows = static_cast<int64_t>(l.window_keys.size() / n_) * WindowBytesPerToken(n_);
  return b;
}

void SequenceTable::FreeLocked(Sequence* seq, uint64_t* tokens, uint64_t* pages) {
  const int64_t p = pool_.page_tokens();
  // Pages on a level below hold no pool page (each is kPageBelow).
  const bool below = seq->below;
  if (below) spill_.free_below(*seq);
  for (LayerState& l : seq->layers) {
    *tokens += l.length;
    *pages += l.pages.size();
    seq->usage->RefundBytes(BytesOf(l));
    if (l.hot) {
      hot_->FreeLayer(&l);
    } else if (!below) {
      pool_.Free(l.pages);
    }
    tokens_compressed_ -= static_cast<int64_t>(l.pages.size()) * p;
    seq->usage->RefundPages(static_cast<int64_t>(l.pages.size()));
    l.digests = {};
    tokens_window_ -= static_cast<int64_t>(l.window_keys.size() / n_);
    l.pages.clear();
    l.page_sums.clear();
    l.window_keys = {};
    l.window_values = {};
    l.length = 0;
  }
}

absl::Status SequenceTable::Release(const std::string& key, const std::string& id, uint64_t* tokens, uint64_t* pages) {
  SequencePtr seq;
  {
    absl::MutexLock lock(&mu_);
    auto it = table_.find(key);
    if (it != table_.end()) {
      seq = it->second;
      // Tombstoned before it leaves the table (see FindOrCreate).
      tombstones_.Add(key, clock_());
      EraseLocked(it);
    }
  }
  if (seq == nullptr) return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(id), " not found"));
  {
    absl::MutexLock lock(&seq->mu);
    if (seq->released) {
      return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(id), " not found (released)"));
    }
    FreeLocked(seq.get(), tokens, pages);
    seq->released = true;
  }
  ++sequences_released_;
  seq->usage->CountRelease();
  metrics_->sequences_released->Increment();
  return absl::OkStatus();
}

int SequenceTable::ExpireIdle() {
  if (options_.ttl_seconds <= 0.0) return 0;
  const int64_t cutoff = absl::ToUnixNanos(clock_() - absl::Seconds(options_.ttl_seconds));
  std::vector<SequencePtr> idle;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = table_.begin(); it != table_.end();) {
      if (it->second->last_access_ns.load() < cutoff) {
        idle.push_back(it->second);
        EraseLocked(it++);
      } else {
        ++it;
      }
    }
  }
  int expired = 0;
  for (const SequencePtr& seq : idle) {
    absl::MutexLock lock(&seq->mu);
    if (seq->released) continue;
    uint64_t tokens = 0, pages = 0;
    FreeLocked(seq.get(), &tokens, &pages);
    seq->released = true;
    seq->usage->CountExpiry();
    ++expired;
  }
  if (expired > 0) {
    sequences_expired_ += expired;
    metrics_->sequences_expired->Increment(expired);
  }
  return expired;
}

size_t SequenceTable::size() const {
  absl::MutexLock lock(&mu_);
  return table_.size();
}

int64_t SequenceTable::device_sequences(int slot) const {
  absl::MutexLock lock(&mu_);
  return device_sequences_[slot];
}

std::vector<std::pair<std::string, SequencePtr>> SequenceTable::Entries() const {
  absl::MutexLock lock(&mu_);
  return {table_.begin(), table_.end()};
}

int SequenceTable::PlaceNew() const {
  absl::MutexLock lock(&mu_);
  return LeastLoadedDevice();
}

HeldBytes SequenceTable::BytesOf(const Sequence& seq) const {
  HeldBytes b;
  for (const LayerState& l : seq.layers) b += BytesOf(l);
  return b;
}

absl::Status SequenceTable::Adopt(const SequencePtr& seq, int64_t pages) {
  absl::MutexLock lock(&mu_);
  if (table_.size() >= options_.max_sequences) {
    return absl::ResourceExhaustedError(absl::StrCat("max_sequences ", options_.max_sequences, " reached"));
  }
  if (table_.count(seq->id) != 0) return absl::AlreadyExistsError("sequence_id repeated in the snapshot");
  // The tenant's quotas count the sequence, its pages and their bytes and
  // its windows' bytes, as the appends that made them did.
  absl::Status quota = seq->usage->ChargeSequence();
  if (!quota.ok()) return quota;
  quota = seq->usage->ChargePages(pages);
  if (!quota.ok()) {
    seq->usage->RefundSequence();
    return quota;
  }
  absl::StatusOr<ByteCharge> bytes = ByteCharge::Take(seq->usage, BytesOf(*seq));
  if (!bytes.ok()) {
    seq->usage->RefundPages(pages);
    seq->usage->RefundSequence();
    return bytes.status();
  }
  bytes->Keep();
  table_.emplace(seq->id, seq);
  ++device_sequences_[seq->device];
  if (spill_.entered) spill_.entered(seq);
  return absl::OkStatus();
}

void SequenceTable::Unadopt(const SequencePtr& seq, int64_t pages) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(seq->id);
  seq->usage->RefundPages(pages);
  seq->usage->RefundBytes(BytesOf(*seq));
  EraseLocked(it);
}

void SequenceTable::PublishGauges() const {
  metrics_->tokens_compressed->Set(static_cast<double>(tokens_compressed_.load()));
  metrics_->tokens_window->Set(static_cast<double>(tokens_window_.load()));
  metrics_->window_bytes->Set(4.0 * n_ * tokens_window_.load());
  metrics_->sequences->Set(static_cast<double>(size()));
  for (size_t k = 0; k < device_ids_.size(); ++k) {
    device_used_gauges_[k]->Set(static_cast<double>(pool_.pages_in_use(static_cast<int>(k))));
    device_sequence_gauges_[k]->Set(static_cast<double>(device_sequences(static_cast<int>(k))));
    if (!device_hot_used_gauges_.empty()) {
      device_hot_used_gauges_[k]->Set(static_cast<double>(hot_->pool().pages_in_use(static_cast<int>(k))));
    }
  }
  if (options_.tokens != nullptr && options_.metrics_per_tenant) {
    ledger_.ForEach([this](const TenantUsage& u) {
      metrics_->SetTenant(u.name(), static_cast<double>(u.pages()), static_cast<double>(u.sequences()),
                          static_cast<double>(u.bytes()));
    });
  }
}

}  // namespace driftkv
