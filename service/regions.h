// Registered memory regions (docs/api.md, "Memory regions"): memory a
// client on the server's host or node registers once, so that requests can
// name (region, offset) instead of carrying bytes.
//
// Two kinds:
//   REGION_HOST_SHM  a sealed memfd the client passed over the region
//                    socket (service/region_socket.h), mapped MAP_SHARED
//                    read-write and page-locked by the backend
//                    (PinHostRegion). The socket adds the mapping here as
//                    PENDING under a random 16-byte attach token; a
//                    RegisterRegion with that token binds it to the
//                    caller's tenant. A token is single-use and pending
//                    mappings not claimed within kAttachTokenSeconds are
//                    dropped; at most kMaxPendingAttachments wait at once.
//   REGION_CUDA_IPC  a client's device allocation, opened by the backend
//                    (OpenIpcRegion). One handle is registered at most once
//                    at a time, by any tenant (ALREADY_EXISTS).
//
// INVARIANTS
// - A region belongs to one tenant. To any other it does not exist: every
//   lookup by another tenant answers exactly what an unknown id answers.
// - Region ids are random 64-bit numbers, never 0 and never issued twice in
//   the process, so a stale id cannot name a newer region.
// - Regions are held by shared_ptr. Unregistering (or expiry, or
//   UnregisterAll) removes a region from the table at once, but its memory
//   stays mapped until the last RegionView of it is dropped: the Region's
//   destructor unpins and unmaps (host) or closes the IPC handle (device).
// - Leases: each region expires when neither RegisterRegion, RenewRegions
//   nor a successful Resolve touched it for its lease; ExpireIdle (called
//   periodically by the server) removes expired regions and stale pending
//   mappings, so a client that dies leaks nothing beyond one lease.
// - Per tenant: at most options.max_regions regions and
//   options.max_region_bytes_per_tenant bytes (0: unlimited); each region
//   at most options.max_region_bytes.
//
// LOCKING: one mutex guards the table; mapping, pinning and IPC opens run
// outside it, and so do the destructors of regions that leave the table.
#ifndef DRIFTKV_SERVICE_REGIONS_H_
#define DRIFTKV_SERVICE_REGIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/driftkv.pb.h"
#include "service/config.h"
#include "wire/fd_socket.h"  // kAttachTokenBytes

namespace driftkv {

constexpr int kMaxPendingAttachments = 64;
constexpr double kAttachTokenSeconds = 10.0;
constexpr size_t kMaxRegionNameBytes = 128;
constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

// Which memory a RegionView's pointer is in.
enum class MemorySpace { kHost, kDevice };

// One registered region. Immutable; its destructor releases the memory
// (`release`, run exactly once).
class Region {
 public:
  Region(v1::RegionKind kind, std::string tenant, uint64_t id, std::string name, void* base, uint64_t size, int device,
         std::function<void()> release)
      : kind_(kind),
        tenant_(std::move(tenant)),
        id_(id),
        name_(std::move(name)),
        base_(base),
        size_(size),
        device_(device),
        release_(std::move(release)) {}
  ~Region() {
    if (release_) release_();
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  v1::RegionKind kind() const { return kind_; }
  const std::string& tenant() const { return tenant_; }
  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  void* base() const { return base_; }  // host pointer, or device pointer for CUDA IPC
  uint64_t size() const { return size_; }
  int device() const { return device_; }  // CUDA device; -1 for host memory
  MemorySpace space() const { return kind_ == v1::REGION_CUDA_IPC ? MemorySpace::kDevice : MemorySpace::kHost; }

 private:
  const v1::RegionKind kind_;
  const std::string tenant_;
  const uint64_t id_;
  const std::string name_;
  void* const base_;
  const uint64_t size_;
  const int device_;
  const std::function<void()> release_;
};

// `bytes` at `data` in a region; the region stays mapped while keep_alive
// is held.
struct RegionView {
  void* data = nullptr;
  MemorySpace space = MemorySpace::kHost;
  int device = -1;
  std::shared_ptr<const Region> keep_alive;
};

// Who passed a host mapping over the region socket (SO_PEERCRED), for logs.
struct PeerCredentials {
  int64_t pid = -1;
  int64_t uid = -1;
};

class RegionTable {
 public:
  using Clock = std::function<absl::Time()>;

  // `backend` (may be null: no pinning, no CUDA IPC) and `registry` (may
  // be null: no metrics) must outlive the table. `clock` null: absl::Now.
  RegionTable(const ServiceOptions& options, Backend* backend, prometheus::Registry* registry, Clock clock = nullptr);
  ~RegionTable();  // UnregisterAll

  // The region socket's side: takes ownership of a MAP_SHARED mapping
  // [base, base + size) (munmap'ed on every path) and returns its attach
  // token. RESOURCE_EXHAUSTED with kMaxPendingAttachments pending or a size
  // past max_region_bytes; UNAVAILABLE after UnregisterAll.
  absl::StatusOr<std::string> AddPending(void* base, uint64_t size, PeerCredentials peer);

  // The RPCs, for `tenant` ("" without tokens).
  absl::Status Register(const v1::RegisterRegionRequest& request, v1::RegisterRegionResponse* response,
                        const std::string& tenant);
  absl::Status Unregister(const v1::UnregisterRegionRequest& request, const std::string& tenant);
  absl::Status Renew(const v1::RenewRegionsRequest& request, v1::RenewRegionsResponse* response,
                     const std::string& tenant);

  // `bytes` at `ref` for `tenant`, `alignment` the element size (a power of
  // two). `field` names the ref in messages ("items[3].query_ref"):
  //   NOT_FOUND         "items[3].query_ref.region_id 123 not found" (unknown,
  //                     unregistered, expired or another tenant's: the same)
  //   OUT_OF_RANGE      offset + bytes past the region's end (or past 2^64)
  //   INVALID_ARGUMENT  offset not a multiple of `alignment`
  // Extends the region's lease.
  absl::StatusOr<RegionView> Resolve(const std::string& tenant, const v1::TensorRef& ref, uint64_t bytes,
                                     uint64_t alignment, absl::string_view field);
  // Resolve in two steps, for a request that names one region many times:
  // Acquire looks the region up once (NOT_FOUND as Resolve) and extends its
  // lease; View checks one ref against it (OUT_OF_RANGE, INVALID_ARGUMENT
  // as Resolve, same words).
  absl::StatusOr<std::shared_ptr<const Region>> Acquire(const std::string& tenant, const v1::TensorRef& ref,
                                                        absl::string_view field);
  static absl::StatusOr<RegionView> View(std::shared_ptr<const Region> region, const v1::TensorRef& ref, uint64_t bytes,
                                         uint64_t alignment, absl::string_view field);
  // The NOT_FOUND every unknown or foreign region gets.
  static absl::Status NotFound(const v1::TensorRef& ref, absl::string_view field);
  // Whether `tenant` has region `id`, without extending its lease.
  bool Contains(const std::string& tenant, uint64_t id) const;
  // Extends the lease of `tenant`'s region `id` (a use that names it
  // otherwise than by a ref); false, and nothing done, if there is none.
  bool Touch(const std::string& tenant, uint64_t id);

  // Removes regions whose lease ran out and stale pending mappings; returns
  // how many regions expired.
  int ExpireIdle();
  // Removes every region and pending mapping and refuses new ones (drain,
  // shutdown). Memory in use by a RegionView is released when it is dropped.
  void UnregisterAll();

  void Info(v1::InfoResponse* response) const;
  void Stats(v1::StatsResponse* response, const std::string& tenant) const;

 private:
  struct Entry {
    std::shared_ptr<const Region> region;
    absl::Duration lease;
    absl::Time expiry;
  };
  struct Pending {
    std::shared_ptr<void> mapping;  // munmap'ed when the last owner drops it
    uint64_t size = 0;
    absl::Time expiry;
    PeerCredentials peer;
  };
  struct TenantUse {
    uint64_t regions = 0;
    uint64_t bytes = 0;
  };

  absl::Time Now() const { return clock_ ? clock_() : absl::Now(); }
  // The granted lease for a requested one (0: the default).
  absl::Duration LeaseFor(uint32_t requested_seconds) const;
  // Room for one more region of `bytes` for `tenant`; RESOURCE_EXHAUSTED naming the limit.
  absl::Status CheckQuota(const std::string& tenant, uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `id` from the table (and the gauges); returns its region.
  std::shared_ptr<const Region> Remove(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The region built from `request`'s memory (mapped, pinned or opened),
  // outside the lock.
  absl::StatusOr<std::shared_ptr<const Region>> Build(const v1::RegisterRegionRequest& request,
                                                      const std::string& tenant);
  void Count(v1::RegionKind kind, int64_t regions, int64_t bytes);

  const ServiceOptions& options_;
  Backend* const backend_;
  const Clock clock_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);  // by attach token
  absl::flat_hash_map<std::string, TenantUse> use_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> issued_ ABSL_GUARDED_BY(mu_);          // every id ever issued
  absl::flat_hash_set<std::string> ipc_handles_ ABSL_GUARDED_BY(mu_);  // of registered CUDA IPC regions
  absl::flat_hash_map<uint64_t, std::string> handle_of_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t registered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t expired_ ABSL_GUARDED_BY(mu_) = 0;

  // driftkv_regions{kind}, driftkv_region_bytes{kind},
  // driftkv_region_registrations_total{kind}, driftkv_region_expirations_total;
  // index 0: host_shm, 1: cuda_ipc. Null without a registry.
  prometheus::Gauge* regions_gauge_[2] = {};
  prometheus::Gauge* bytes_gauge_[2] = {};
  prometheus::Counter* registrations_[2] = {};
  prometheus::Counter* expirations_ = nullptr;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_REGIONS_H_
