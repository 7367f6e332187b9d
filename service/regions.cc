#include "service/regions.h"

#include <sys/mman.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "service/quoted.h"

namespace driftkv {
namespace {

constexpr int kHostIndex = 0;
constexpr int kIpcIndex = 1;

int IndexOf(v1::RegionKind kind) {
  return kind == v1::REGION_CUDA_IPC ? kIpcIndex : kHostIndex;
}

// Random bytes from the kernel's CSPRNG (tokens must not be guessable).
void RandomBytes(void* out, size_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got <= 0) continue;  // EINTR; the pool is initialised long before a server starts
    p += got;
    n -= static_cast<size_t>(got);
  }
}

void Log(const std::string& line) {
  std::cerr << "driftkv-server: regions: " << line << std::endl;
}

}  // namespace

RegionTable::RegionTable(const ServiceOptions& options, Backend* backend, prometheus::Registry* registry, Clock clock)
    : options_(options), backend_(backend), clock_(std::move(clock)) {
  if (registry == nullptr) return;
  auto& regions =
      prometheus::BuildGauge().Name("driftkv_regions").Help("Registered memory regions, by kind").Register(*registry);
  auto& bytes = prometheus::BuildGauge()
                    .Name("driftkv_region_bytes")
                    .Help("Bytes of registered memory regions, by kind")
                    .Register(*registry);
  auto& registrations = prometheus::BuildCounter()
                            .Name("driftkv_region_registrations_total")
                            .Help("Memory regions registered, by kind")
                            .Register(*registry);
  const char* kinds[2] = {"host_shm", "cuda_ipc"};
  for (int k = 0; k < 2; ++k) {
    regions_gauge_[k] = &regions.Add({{"kind", kinds[k]}});
    bytes_gauge_[k] = &bytes.Add({{"kind", kinds[k]}});
    registrations_[k] = &registrations.Add({{"kind", kinds[k]}});
  }
  expirations_ = &prometheus::BuildCounter()
                      .Name("driftkv_region_expirations_total")
                      .Help("Memory regions unregistered because their lease ran out")
                      .Register(*registry)
                      .Add({});
}

RegionTable::~RegionTable() {
  UnregisterAll();
}

absl::Duration RegionTable::LeaseFor(uint32_t requested_seconds) const {
  const uint32_t s = requested_seconds == 0 ? options_.region_lease_seconds
                                            : std::min(requested_seconds, options_.max_region_lease_seconds);
  return absl::Seconds(s);
}

void RegionTable::Count(v1::RegionKind kind, int64_t regions, int64_t bytes) {
  const int k = IndexOf(kind);
  if (regions_gauge_[k] == nullptr) return;
  regions_gauge_[k]->Increment(static_cast<double>(regions));
  bytes_gauge_[k]->Increment(static_cast<double>(bytes));
}

uint64_t RegionTable::NewId() {
  uint64_t id = 0;
  while (id == 0 || issued_.contains(id)) RandomBytes(&id, sizeof(id));
  issued_.insert(id);
  return id;
}

absl::Status RegionTable::CheckQuota(const std::string& tenant, uint64_t bytes) const {
  auto it = use_.find(tenant);
  const TenantUse use = it == use_.end() ? TenantUse{} : it->second;
  if (use.regions + 1 > options_.max_regions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant holds ", use.regions, " regions; max_regions is ", options_.max_regions));
  }
  if (options_.max_region_bytes_per_tenant > 0 && use.bytes + bytes > options_.max_region_bytes_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant holds ", use.bytes, " region bytes; ", bytes,
                                                     " more would pass max_region_bytes_per_tenant ",
                                                     options_.max_region_bytes_per_tenant));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RegionTable::AddPending(void* base, uint64_t size, PeerCredentials peer) {
  std::shared_ptr<void> mapping(base, [size](void* p) { munmap(p, size); });
  if (size == 0 || size > options_.max_region_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("region of ", size, " bytes out of range [1, max_region_bytes ", options_.max_region_bytes, "]"));
  }
  std::string token(kAttachTokenBytes, '\0');
  RandomBytes(token.data(), token.size());
  std::vector<std::shared_ptr<void>> stale;  // unmapped after the lock
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the server is shutting down");
  const absl::Time now = Now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.expiry <= now) {
      stale.push_back(std::move(it->second.mapping));
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
  if (pending_.size() >= kMaxPendingAttachments) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kMaxPendingAttachments, " attachments are waiting for RegisterRegion; register them or wait ",
                     kAttachTokenSeconds, " s"));
  }
  pending_[token] = Pending{std::move(mapping), size, now + absl::Seconds(kAttachTokenSeconds), peer};
  return token;
}

absl::StatusOr<std::shared_ptr<const Region>> RegionTable::Build(const v1::RegisterRegionRequest& request,
                                                                 const std::string& tenant) {
  if (request.kind() == v1::REGION_HOST_SHM) {
    if (request.attach_token().size() != kAttachTokenBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("attach_token has ", request.attach_token().size(), " bytes; must be ", kAttachTokenBytes));
    }
    Pending claimed;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(request.attach_token());
      if (it == pending_.end() || it->second.expiry <= Now()) {
        if (it != pending_.end()) pending_.erase(it);
        return absl::NotFoundError("attach_token unknown, used already or expired");
      }
      claimed = std::move(it->second);
      pending_.erase(it);  // single use, whatever happens next
      if (absl::Status st = CheckQuota(tenant, claimed.size); !st.ok()) return st;
    }
    Backend* backend = backend_;
    void* base = claimed.mapping.get();
    bool pinned = false;
    if (backend != nullptr) {
      if (absl::Status st = backend->PinHostRegion(base, claimed.size); !st.ok()) return st;
      pinned = true;
    }
    Log(absl::StrCat("host region of ", claimed.size, " bytes from pid ", claimed.peer.pid, " uid ", claimed.peer.uid,
                     " registered by tenant ", Quoted(tenant)));
    std::shared_ptr<void> mapping = std::move(claimed.mapping);
    return std::make_shared<const Region>(v1::REGION_HOST_SHM, tenant, 0, request.name(), base, claimed.size, -1,
                                          [backend, pinned, mapping]() {
                                            if (pinned) backend->UnpinHostRegion(mapping.get());
                                          });
  }
  if (request.kind() == v1::REGION_CUDA_IPC) {
    if (request.cuda_ipc_handle().size() != kCudaIpcHandleBytes) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc_handle has ", request.cuda_ipc_handle().size(),
                                                     " bytes; must be ", kCudaIpcHandleBytes));
    }
    if (request.size() == 0 || request.size() > options_.max_region_bytes) {
      return absl::OutOfRangeError(
          absl::StrCat("size ", request.size(), " out of range [1, max_region_bytes ", options_.max_region_bytes, "]"));
    }
    if (backend_ == nullptr) return absl::UnimplementedError("no backend for CUDA IPC regions");
    {
      absl::MutexLock lock(&mu_);
      if (ipc_handles_.contains(request.cuda_ipc_handle())) {
        return absl::AlreadyExistsError("cuda_ipc_handle is registered already");
      }
      if (absl::Status st = CheckQuota(tenant, request.size()); !st.ok()) return st;
    }
    absl::StatusOr<void*> dev = backend_->OpenIpcRegion(
        request.cuda_ipc_handle().data(), request.cuda_ipc_handle().size(), request.device(), request.size());
    if (!dev.ok()) return dev.status();
    Backend* backend = backend_;
    void* ptr = *dev;
    return std::make_shared<const Region>(v1::REGION_CUDA_IPC, tenant, 0, request.name(), ptr, request.size(),
                                          request.device(), [backend, ptr]() { backend->CloseIpcRegion(ptr); });
  }
  return absl::InvalidArgumentError(
      absl::StrCat("kind ", v1::RegionKind_Name(request.kind()), " is not REGION_HOST_SHM or REGION_CUDA_IPC"));
}

absl::Status RegionTable::Register(const v1::RegisterRegionRequest& request, v1::RegisterRegionResponse* response,
                                   const std::string& tenant) {
  if (request.name().size() > kMaxRegionNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name has ", request.name().size(), " bytes; at most ", kMaxRegionNameBytes));
  }
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::UnavailableError("the server is shutting down");
  }
  absl::StatusOr<std::shared_ptr<const Region>> built = Build(request, tenant);
  if (!built.ok()) return built.status();
  std::shared_ptr<const Region> memory = *std::move(built);
  // The id is known only now; the region that goes into the table holds
  // the built one (and so its memory) alive.
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the server is shutting down");
  // Checked again: another registration may have come in meanwhile.
  if (absl::Status st = CheckQuota(tenant, memory->size()); !st.ok()) return st;
  const bool ipc = memory->kind() == v1::REGION_CUDA_IPC;
  if (ipc && ipc_handles_.contains(request.cuda_ipc_handle())) {
    return absl::AlreadyExistsError("cuda_ipc_handle is registered already");
  }
  const uint64_t id = NewId();
  auto region = std::make_shared<const Region>(memory->kind(), tenant, id, memory->name(), memory->base(),
                                               memory->size(), memory->device(), [memory]() {});
  const absl::Duration lease = LeaseFor(request.lease_seconds());
  regions_[id] = Entry{region, lease, Now() + lease};
  if (ipc) {
    ipc_handles_.insert(request.cuda_ipc_handle());
    handle_of_[id] = request.cuda_ipc_handle();
  }
  TenantUse& use = use_[tenant];
  ++use.regions;
  use.bytes += region->size();
  total_bytes_ += region->size();
  ++registered_;
  Count(region->kind(), 1, static_cast<int64_t>(region->size()));
  if (registrations_[IndexOf(region->kind())] != nullptr) registrations_[IndexOf(region->kind())]->Increment();
  response->set_region_id(id);
  response->set_size(region->size());
  response->set_lease_seconds(static_cast<uint32_t>(absl::ToInt64Seconds(lease)));
  return absl::OkStatus();
}

std::shared_ptr<const Region> RegionTable::Remove(uint64_t id) {
  auto it = regions_.find(id);
  if (it == regions_.end()) return nullptr;
  std::shared_ptr<const Region> region = std::move(it->second.region);
  regions_.erase(it);
  if (auto h = handle_of_.find(id); h != handle_of_.end()) {
    ipc_handles_.erase(h->second);
    handle_of_.erase(h);
  }
  TenantUse& use = use_[region->tenant()];
  --use.regions;
  use.bytes -= region->size();
  if (use.regions == 0) use_.erase(region->tenant());
  total_bytes_ -= region->size();
  Count(region->kind(), -1, -static_cast<int64_t>(region->size()));
  return region;
}

absl::Status RegionTable::Unregister(const v1::UnregisterRegionRequest& request, const std::string& tenant) {
  std::shared_ptr<const Region> region;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(request.region_id());
  if (it == regions_.end() || it->second.region->tenant() != tenant) {
    return absl::NotFoundError(absl::StrCat("region_id ", request.region_id(), " not found"));
  }
  region = Remove(request.region_id());
  return absl::OkStatus();
}

absl::Status RegionTable::Renew(const v1::RenewRegionsRequest& request, v1::RenewRegionsResponse* response,
                                const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  absl::Duration shortest = absl::InfiniteDuration();
  auto renew = [&](Entry& e) {
    e.expiry = now + e.lease;
    shortest = std::min(shortest, e.lease);
  };
  if (request.region_ids().empty()) {
    for (auto& [id, e] : regions_) {
      if (e.region->tenant() == tenant) renew(e);
    }
  } else {
    for (uint64_t id : request.region_ids()) {
      auto it = regions_.find(id);
      if (it == regions_.end() || it->second.region->tenant() != tenant) {
        response->add_unknown_region_ids(id);
      } else {
        renew(it->second);
      }
    }
  }
  response->set_lease_seconds(
      shortest == absl::InfiniteDuration() ? 0 : static_cast<uint32_t>(absl::ToInt64Seconds(shortest)));
  return absl::OkStatus();
}

absl::Status RegionTable::NotFound(const v1::TensorRef& ref, absl::string_view field) {
  return absl::NotFoundError(absl::StrCat(field, ".region_id ", ref.region_id(), " not found"));
}

absl::StatusOr<std::shared_ptr<const Region>> RegionTable::Acquire(const std::string& tenant, const v1::TensorRef& ref,
                                                                   absl::string_view field) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(ref.region_id());
  if (it == regions_.end() || it->second.region->tenant() != tenant) return NotFound(ref, field);
  it->second.expiry = Now() + it->second.lease;
  return it->second.region;
}

absl::StatusOr<RegionView> RegionTable::View(std::shared_ptr<const Region> region, const v1::TensorRef& ref,
                                             uint64_t bytes, uint64_t alignment, absl::string_view field) {
  const uint64_t offset = ref.offset();
  if (offset > region->size() || bytes > region->size() - offset) {
    return absl::OutOfRangeError(absl::StrCat(field, ".offset ", offset, " + ", bytes,
                                              " bytes is past the end of region ", ref.region_id(), " (",
                                              region->size(), " bytes)"));
  }
  if (alignment > 1 && offset % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".offset ", offset, " is not a multiple of ", alignment));
  }
  RegionView view;
  view.data = static_cast<char*>(region->base()) + offset;
  view.space = region->space();
  view.device = region->device();
  view.keep_alive = std::move(region);
  return view;
}

absl::StatusOr<RegionView> RegionTable::Resolve(const std::string& tenant, const v1::TensorRef& ref, uint64_t bytes,
                                                uint64_t alignment, absl::string_view field) {
  std::shared_ptr<const Region> region;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(ref.region_id());
    if (it == regions_.end() || it->second.region->tenant() != tenant) return NotFound(ref, field);
    region = it->second.region;
    // The lease is extended only by a use that succeeds: a client sending
    // bad refs does not keep a region.
    absl::StatusOr<RegionView> view = View(region, ref, bytes, alignment, field);
    if (!view.ok()) return view.status();
    it->second.expiry = Now() + it->second.lease;
    return view;
  }
}

bool RegionTable::Contains(const std::string& tenant, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  return it != regions_.end() && it->second.region->tenant() == tenant;
}

bool RegionTable::Touch(const std::string& tenant, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.region->tenant() != tenant) return false;
  it->second.expiry = Now() + it->second.lease;
  return true;
}

int RegionTable::ExpireIdle() {
  std::vector<std::shared_ptr<const Region>> expired;
  std::vector<std::shared_ptr<void>> stale;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    std::vector<uint64_t> ids;
    for (const auto& [id, e] : regions_) {
      if (e.expiry <= now) ids.push_back(id);
    }
    for (uint64_t id : ids) expired.push_back(Remove(id));
    expired_ += expired.size();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.expiry <= now) {
        stale.push_back(std::move(it->second.mapping));
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (const auto& r : expired) {
    Log(absl::StrCat("region ", r->id(), " (", Quoted(r->name()), ", tenant ", Quoted(r->tenant()), ") expired"));
  }
  if (expirations_ != nullptr) expirations_->Increment(static_cast<double>(expired.size()));
  return static_cast<int>(expired.size());
}

void RegionTable::UnregisterAll() {
  std::vector<std::shared_ptr<const Region>> all;
  absl::flat_hash_map<std::string, Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    std::vector<uint64_t> ids;
    for (const auto& [id, e] : regions_) ids.push_back(id);
    for (uint64_t id : ids) all.push_back(Remove(id));
    pending.swap(pending_);
  }
}

void RegionTable::Info(v1::InfoResponse* response) const {
  response->set_region_socket(options_.region_socket);
  response->set_max_region_bytes(options_.max_region_bytes);
  response->set_region_lease_seconds(options_.region_lease_seconds);
  response->set_max_region_lease_seconds(options_.max_region_lease_seconds);
  response->set_max_regions(options_.max_regions);
}

void RegionTable::Stats(v1::StatsResponse* response, const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  response->set_regions(regions_.size());
  response->set_region_bytes(total_bytes_);
  if (auto it = use_.find(tenant); it != use_.end()) {
    response->set_tenant_regions(it->second.regions);
    response->set_tenant_region_bytes(it->second.bytes);
  }
  response->set_regions_registered(registered_);
  response->set_regions_expired(expired_);
}

}  // namespace driftkv
