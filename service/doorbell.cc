#include "service/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backends/attend_phases.h"
#include "wire/doorbell.h"
#include "wire/monotonic.h"

namespace driftkv {
namespace {

using doorbell::ClientLine;
using doorbell::ServerLine;

// Shared futex words (the mapping is MAP_SHARED between processes, so not
// FUTEX_PRIVATE_FLAG).
void FutexWait(uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void FutexWake(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void Pause() {
  __builtin_ia32_pause();
}

}  // namespace

namespace {

// The inline tensor an item of a prepared request carries, or null.
const char* InlineTensor(const v1::AttendItem& it) {
  if (!it.query().empty()) return "query";
  if (!it.new_key().empty()) return "new_key";
  if (!it.new_value().empty()) return "new_value";
  return nullptr;
}

// kPrepare: keeps (or, with no bytes, drops) the request in `slot`. A
// refused request leaves the slot as it was.
absl::Status Prepare(absl::string_view bytes, uint32_t slot, DoorbellScratch* scratch) {
  auto& slots = scratch->prepared;
  const uint64_t old = slot < slots.size() && slots[slot] != nullptr ? slots[slot]->bytes : 0;
  std::unique_ptr<DoorbellScratch::Prepared> p;
  if (!bytes.empty()) {
    if (scratch->prepared_bytes - old + bytes.size() > doorbell::kMaxPreparedBytes) {
      return absl::ResourceExhaustedError(absl::StrCat("doorbell prepared request of ", bytes.size(),
                                                       " bytes: the doorbell's prepared requests would hold ",
                                                       scratch->prepared_bytes - old + bytes.size(),
                                                       " bytes (kMaxPreparedBytes ", doorbell::kMaxPreparedBytes, ")"));
    }
    p = std::make_unique<DoorbellScratch::Prepared>();
    if (!p->request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("doorbell prepared request of ", bytes.size(), " bytes is not an AttendRequest"));
    }
    for (int i = 0; i < p->request.items_size(); ++i) {
      const v1::AttendItem& it = p->request.items(i);
      if (const char* field = InlineTensor(it); field != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "].", field, " is inline; a prepared request names its tensors by reference (",
                         field, "_ref)"));
      }
      if (it.has_new_token_index()) p->indexed.emplace_back(i, it.new_token_index());
    }
    p->bytes = bytes.size();
  }
  if (slot >= slots.size()) {
    if (p == nullptr) return absl::OkStatus();
    slots.resize(slot + 1);
  }
  scratch->prepared_bytes = scratch->prepared_bytes - old + (p != nullptr ? p->bytes : 0);
  slots[slot] = std::move(p);
  return absl::OkStatus();
}

// kAttendPrepared: the request in `slot`, its token indexes advanced.
absl::StatusOr<DoorbellScratch::Prepared*> Prepared(uint32_t slot, uint64_t offset, DoorbellScratch* scratch) {
  if (slot >= scratch->prepared.size() || scratch->prepared[slot] == nullptr) {
    return absl::NotFoundError(absl::StrCat("doorbell prepared slot ", slot, " is empty"));
  }
  DoorbellScratch::Prepared& p = *scratch->prepared[slot];
  for (const auto& [item, index] : p.indexed) {
    if (offset > std::numeric_limits<uint64_t>::max() - index) {
      return absl::InvalidArgumentError(absl::StrCat("doorbell token_index_offset ", offset, " overflows items[", item,
                                                     "].new_token_index ", index, " of prepared slot ", slot));
    }
  }
  for (const auto& [item, index] : p.indexed) p.request.mutable_items(item)->set_new_token_index(index + offset);
  return &p;
}

}  // namespace

void ServeDoorbellRequest(uint8_t* base, uint64_t request_capacity, uint64_t response_capacity, uint64_t seq,
                          const AttendFn& attend, const std::string& tenant, DoorbellScratch* scratch,
                          const ReusingAttendFn* reusing) {
  auto* c = reinterpret_cast<ClientLine*>(base + doorbell::kClientLine);
  auto* s = reinterpret_cast<ServerLine*>(base + doorbell::kServerLine);
  AttendPhaseClock::Begin();
  // Each word of the client line is read once: the client may change them.
  const uint32_t bytes = __atomic_load_n(&c->request_bytes, __ATOMIC_RELAXED);
  const int64_t deadline = __atomic_load_n(&c->deadline_ns, __ATOMIC_RELAXED);
  const uint32_t kind = __atomic_load_n(&c->kind, __ATOMIC_RELAXED);
  const uint32_t slot = __atomic_load_n(&c->slot, __ATOMIC_RELAXED);
  const uint64_t offset = __atomic_load_n(&c->token_index_offset, __ATOMIC_RELAXED);
  v1::AttendResponse* response = &scratch->response;
  response->Clear();
  const v1::AttendRequest* request = nullptr;
  AttendReuse* reuse = nullptr;  // a prepared request's
  absl::Status st;
  if (kind != doorbell::kAttend && kind != doorbell::kPrepare && kind != doorbell::kAttendPrepared) {
    st = absl::InvalidArgumentError(
        absl::StrCat("doorbell kind ", kind, " is not 0 (attend), 1 (prepare) or 2 (attend prepared)"));
  } else if (kind != doorbell::kAttend && slot >= doorbell::kMaxPreparedSlots) {
    st = absl::InvalidArgumentError(
        absl::StrCat("doorbell slot ", slot, " is not below kMaxPreparedSlots ", doorbell::kMaxPreparedSlots));
  } else if (kind != doorbell::kAttendPrepared && bytes > request_capacity) {
    st = absl::InvalidArgumentError(
        absl::StrCat("doorbell request_bytes ", bytes, " exceeds its request capacity ", request_capacity));
  }
  // A late request changes nothing, a kPrepare included.
  if (st.ok() && deadline != 0) {
    const int64_t now = MonotonicNs();
    if (now > deadline) {
      // deadline_ns is the client's word and may be any int64 (INT64_MIN):
      // now - deadline overflows int64 but fits, and wraps right, in uint64.
      const uint64_t late_ns = static_cast<uint64_t>(now) - static_cast<uint64_t>(deadline);
      st = absl::DeadlineExceededError(
          absl::StrCat("doorbell request ", seq, ": its deadline passed ", late_ns / 1000, " us before it was read"));
    }
  }
  if (st.ok() && kind != doorbell::kAttendPrepared) {
    // One copy out of the shared memory, then parse the copy: the client
    // can change the shared bytes at any time.
    scratch->bytes.assign(reinterpret_cast<const char*>(base + doorbell::kHeaderBytes), bytes);
    if (kind == doorbell::kPrepare) {
      st = Prepare(scratch->bytes, slot, scratch);
    } else if (!scratch->request.ParseFromString(scratch->bytes)) {
      st = absl::InvalidArgumentError(absl::StrCat("doorbell request of ", bytes, " bytes is not an AttendRequest"));
    } else {
      request = &scratch->request;
    }
  }
  if (st.ok() && kind == doorbell::kAttendPrepared) {
    absl::StatusOr<DoorbellScratch::Prepared*> p = Prepared(slot, offset, scratch);
    if (p.ok()) {
      request = &(*p)->request;
      reuse = &(*p)->reuse;
    } else {
      st = p.status();
    }
  }
  if (st.ok() && request != nullptr) {
    AttendPhaseClock::Mark(AttendPhase::kRequest);
    st = reuse != nullptr && reusing != nullptr && *reusing ? (*reusing)(*request, response, tenant, reuse)
                                                            : attend(*request, response, tenant);
  } else {
    AttendPhaseClock::Abandon();
  }
  uint8_t* out = base + doorbell::kHeaderBytes + request_capacity;
  uint64_t out_bytes = 0;
  if (st.ok() && request != nullptr) {
    out_bytes = response->ByteSizeLong();
    if (out_bytes > response_capacity) {
      st = absl::ResourceExhaustedError(
          absl::StrCat("doorbell response of ", out_bytes, " bytes exceeds its response capacity ", response_capacity));
    } else {
      response->SerializeWithCachedSizesToArray(out);
    }
  }
  if (!st.ok()) {
    const absl::string_view m = st.message();
    out_bytes = std::min<uint64_t>(m.size(), response_capacity);
    std::memcpy(out, m.data(), out_bytes);
  }
  __atomic_store_n(&s->code, static_cast<int32_t>(st.code()), __ATOMIC_RELAXED);
  __atomic_store_n(&s->response_bytes, static_cast<uint32_t>(out_bytes), __ATOMIC_RELAXED);
  __atomic_store_n(&s->response_seq, seq, __ATOMIC_RELEASE);
  __atomic_store_n(&s->response_word, static_cast<uint32_t>(seq), __ATOMIC_SEQ_CST);
  FutexWake(&s->response_word);
}

// One doorbell and its thread.
class DoorbellTable::Bell {
 public:
  Bell(RegionTable* regions, const AttendFn* attend, const ReusingAttendFn* reusing,
       std::shared_ptr<const Region> region, uint8_t* base, uint64_t request_capacity, uint64_t response_capacity,
       std::string tenant)
      : regions_(regions),
        attend_(attend),
        reusing_(reusing),
        region_(std::move(region)),
        base_(base),
        request_capacity_(request_capacity),
        response_capacity_(response_capacity),
        tenant_(std::move(tenant)) {
    auto* c = reinterpret_cast<ClientLine*>(base_ + doorbell::kClientLine);
    auto* s = reinterpret_cast<ServerLine*>(base_ + doorbell::kServerLine);
    last_ = __atomic_load_n(&c->request_seq, __ATOMIC_ACQUIRE);
    __atomic_store_n(&s->server_sleeping, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&s->response_seq, last_, __ATOMIC_RELEASE);
    __atomic_store_n(&s->response_word, static_cast<uint32_t>(last_), __ATOMIC_SEQ_CST);
    thread_ = std::thread([this] { Run(); });
  }
  ~Bell() {
    stop_.store(true);
    auto* c = reinterpret_cast<ClientLine*>(base_ + doorbell::kClientLine);
    FutexWake(&c->request_word);
    thread_.join();
  }
  const std::string& tenant() const { return tenant_; }
  uint64_t region_id() const { return region_->id(); }
  bool stopped() const { return done_.load(); }

 private:
  void Run() {
    auto* c = reinterpret_cast<ClientLine*>(base_ + doorbell::kClientLine);
    auto* s = reinterpret_cast<ServerLine*>(base_ + doorbell::kServerLine);
    DoorbellScratch scratch;
    int64_t spin_until = MonotonicNs() + absl::ToInt64Nanoseconds(kSpinTime);
    while (!stop_.load(std::memory_order_relaxed)) {
      const uint64_t seq = __atomic_load_n(&c->request_seq, __ATOMIC_ACQUIRE);
      if (seq != last_) {
        // A request after the region left the table (unregistered, expired,
        // drained) goes unanswered, even while this thread is still awake.
        if (!regions_->Touch(tenant_, region_->id())) break;
        ServeDoorbellRequest(base_, request_capacity_, response_capacity_, seq, *attend_, tenant_, &scratch, reusing_);
        last_ = seq;
        spin_until = MonotonicNs() + absl::ToInt64Nanoseconds(kSpinTime);
        continue;
      }
      if (MonotonicNs() < spin_until) {
        Pause();
        continue;
      }
      // Sleep. The client stores request_seq, then reads server_sleeping;
      // this thread stores server_sleeping, then reads request_seq (both
      // sequentially consistent): one of the two sees the other's store.
      __atomic_store_n(&s->server_sleeping, 1u, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&c->request_seq, __ATOMIC_SEQ_CST) == last_) {
        FutexWait(&c->request_word, static_cast<uint32_t>(last_), 50 * 1000 * 1000);
      }
      __atomic_store_n(&s->server_sleeping, 0u, __ATOMIC_SEQ_CST);
      // Gone from the table (unregistered, expired, drained): stop.
      if (!regions_->Contains(tenant_, region_->id())) break;
      spin_until = 0;
    }
    done_.store(true);
  }

  RegionTable* const regions_;
  const AttendFn* const attend_;
  const ReusingAttendFn* const reusing_;
  const std::shared_ptr<const Region> region_;
  uint8_t* const base_;
  const uint64_t request_capacity_, response_capacity_;
  const std::string tenant_;
  uint64_t last_ = 0;
  std::atomic<bool> stop_{false}, done_{false};
  std::thread thread_;
};

DoorbellTable::DoorbellTable(RegionTable* regions, AttendFn attend, ReusingAttendFn reusing)
    : regions_(regions), attend_(std::move(attend)), reusing_(std::move(reusing)) {}

DoorbellTable::~DoorbellTable() {
  CloseAll();
}

absl::Status DoorbellTable::Open(const v1::OpenDoorbellRequest& request, v1::OpenDoorbellResponse* response,
                                 const std::string& tenant) {
  const uint64_t c = request.request_capacity(), r = request.response_capacity();
  for (const auto& [name, v] : {std::pair<const char*, uint64_t>{"request_capacity", c}, {"response_capacity", r}}) {
    if (v == 0 || v % doorbell::kAlignment != 0 || v > doorbell::kMaxAreaBytes) {
      return absl::InvalidArgumentError(absl::StrCat(name, " ", v, " must be a positive multiple of ",
                                                     doorbell::kAlignment, " up to ", doorbell::kMaxAreaBytes));
    }
  }
  if (request.offset() % doorbell::kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", request.offset(), " is not a multiple of ", doorbell::kAlignment));
  }
  v1::TensorRef ref;
  ref.set_region_id(request.region_id());
  ref.set_offset(request.offset());
  absl::StatusOr<RegionView> view =
      regions_->Resolve(tenant, ref, doorbell::Bytes(c, r), doorbell::kAlignment, "doorbell");
  if (!view.ok()) return view.status();
  if (view->space != MemorySpace::kHost) {
    return absl::InvalidArgumentError(absl::StrCat("doorbell.region_id ", request.region_id(),
                                                   " is device memory; a doorbell lives in a host region"));
  }
  std::vector<std::unique_ptr<Bell>> finished;  // joined outside the lock
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the server is draining; no new doorbells");
  int mine = 0;
  for (auto it = bells_.begin(); it != bells_.end();) {
    if (it->second->stopped()) {
      finished.push_back(std::move(it->second));
      bells_.erase(it++);
      continue;
    }
    mine += it->second->tenant() == tenant;
    ++it;
  }
  if (mine >= kMaxDoorbellsPerTenant || static_cast<int>(bells_.size()) >= kMaxDoorbells) {
    return absl::ResourceExhaustedError(absl::StrCat("open doorbells: ", mine, " of the tenant (max ",
                                                     kMaxDoorbellsPerTenant, "), ", bells_.size(), " in all (max ",
                                                     kMaxDoorbells, ")"));
  }
  const uint64_t id = next_id_++;
  bells_[id] = std::make_unique<Bell>(regions_, &attend_, &reusing_, view->keep_alive,
                                      static_cast<uint8_t*>(view->data), c, r, tenant);
  response->set_doorbell_id(id);
  return absl::OkStatus();
}

absl::Status DoorbellTable::Close(const v1::CloseDoorbellRequest& request, const std::string& tenant) {
  std::unique_ptr<Bell> bell;
  {
    absl::MutexLock lock(&mu_);
    auto it = bells_.find(request.doorbell_id());
    if (it == bells_.end() || it->second->tenant() != tenant) {
      return absl::NotFoundError(absl::StrCat("doorbell_id ", request.doorbell_id(), " not found"));
    }
    bell = std::move(it->second);
    bells_.erase(it);
  }
  return absl::OkStatus();  // `bell` stops and joins here, outside the lock
}

void DoorbellTable::CloseAll() {
  absl::flat_hash_map<uint64_t, std::unique_ptr<Bell>> all;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    all.swap(bells_);
  }
}

int DoorbellTable::Sweep() {
  std::vector<std::unique_ptr<Bell>> finished;  // joined outside the lock
  {
    absl::MutexLock lock(&mu_);
    for (auto it = bells_.begin(); it != bells_.end();) {
      if (it->second->stopped()) {
        finished.push_back(std::move(it->second));
        bells_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(finished.size());
}

int DoorbellTable::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(bells_.size());
}

}  // namespace driftkv
