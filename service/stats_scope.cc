#include "service/stats_scope.h"

#include <utility>

namespace driftkv {

void KeepTenantScope(v1::StatsResponse* stats) {
  const v1::StatsResponse& s = *stats;
  v1::StatsResponse kept;
  // The caller's tenant.
  kept.set_tenant(s.tenant());
  kept.set_tenant_sequences(s.tenant_sequences());
  kept.set_tenant_pages(s.tenant_pages());
  kept.set_tenant_max_sequences(s.tenant_max_sequences());
  kept.set_tenant_max_pages(s.tenant_max_pages());
  kept.set_tenant_bytes(s.tenant_bytes());
  kept.set_tenant_max_bytes(s.tenant_max_bytes());
  kept.set_tenant_nccl_channels(s.tenant_nccl_channels());
  kept.set_tenant_max_nccl_channels(s.tenant_max_nccl_channels());
  kept.set_tenant_regions(s.tenant_regions());
  kept.set_tenant_region_bytes(s.tenant_region_bytes());
  kept.set_sequences(s.sequences());
  kept.set_sequences_released(s.sequences_released());
  kept.set_sequences_expired(s.sequences_expired());
  kept.set_tombstones(s.tombstones());
  // The pools' load: what a client needs to tell a full server from its
  // own quota.
  kept.set_pages_in_use(s.pages_in_use());
  kept.set_capacity_pages(s.capacity_pages());
  kept.set_bytes_in_use(s.bytes_in_use());
  kept.set_capacity_bytes(s.capacity_bytes());
  kept.set_cold_copy_pages(s.cold_copy_pages());  // of pages_in_use, taken back on demand
  kept.set_cold_copy_bytes(s.cold_copy_bytes());
  kept.set_hot_pages_in_use(s.hot_pages_in_use());
  kept.set_hot_capacity_pages(s.hot_capacity_pages());
  kept.set_hot_bytes_in_use(s.hot_bytes_in_use());
  kept.set_hot_capacity_bytes(s.hot_capacity_bytes());
  for (const v1::DeviceStats& d : s.devices()) {
    v1::DeviceStats* k = kept.add_devices();
    k->set_device(d.device());
    k->set_pages_in_use(d.pages_in_use());
    k->set_bytes_in_use(d.bytes_in_use());
    k->set_hot_pages_in_use(d.hot_pages_in_use());
    k->set_hot_bytes_in_use(d.hot_bytes_in_use());
    k->set_cold_copy_pages(d.cold_copy_pages());
  }
  *stats = std::move(kept);
}

}  // namespace driftkv
