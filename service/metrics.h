// The Prometheus metrics of driftkv-server (docs/metrics.md lists them with
// their meaning). All names start with driftkv_ and carry their unit.
// Counters and histograms are updated by the handler and the gRPC layer;
// gauges are set after each mutation. prometheus-cpp metrics are
// thread-safe, so no lock is needed around them.
#ifndef DRIFTKV_SERVICE_METRICS_H_
#define DRIFTKV_SERVICE_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "backends/attend_phases.h"
#include "backends/attend_route.h"
#include "codec/kv_codec.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace driftkv {

// Why a hot layer went back to the cold tier (label reason= of
// driftkv_tier_demotions_total): to make room for another layer's
// promotion or new page, idle for hot_idle_seconds, the layer's own new
// page found no hot page even after demoting others, or the drain's
// snapshot (which stores pages in their cold form).
enum DemotionReason : int {
  kDemoteBudget = 0,
  kDemoteIdle = 1,
  kDemoteAppend = 2,
  kDemoteDrain = 3,
  kDemotionReasons = 4
};

// Why an integrity check refused a chunk or step (label reason= of
// driftkv_integrity_rejections_total; docs/security.md): its crc32c did not
// match, repeated tokens differed from the stored ones, or the id was
// tombstoned.
enum IntegrityReason : int { kRejectCrc32c = 0, kRejectRepeat = 1, kRejectTombstone = 2, kIntegrityReasons = 3 };

class Metrics {
 public:
  // `per_tenant`: register driftkv_tenant_pages / _sequences / _bytes{tenant}
  // (config metrics_per_tenant). Without it no series carries a tenant's
  // name: the metrics port has no authentication.
  explicit Metrics(bool per_tenant = false);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // One page encoded: budget utilisation (bytes used / budget, mean over the
  // page's streams), symbols, moves, retries and fallbacks, by stream.
  // `key_util` / `value_util`: per-stream budget utilisation when the backend
  // reports it (one histogram sample per stream); empty: one sample per page.
  void RecordPage(const CodecStats& stats, const std::vector<float>& key_util, const std::vector<float>& value_util);
  // One finished RPC. `code` is the gRPC status code name, e.g. "OK".
  void RecordRpc(const std::string& method, const std::string& code, double seconds);
  // What one tenant holds (driftkv_tenant_pages / _sequences /
  // _bytes{tenant}); only with tokens, so the label set is the tokens
  // file's tenants. Does nothing unless constructed with `per_tenant`.
  void SetTenant(const std::string& tenant, double pages, double sequences, double bytes);
  // One Lookup (docs/prefix_cache.md, "Hit rates"): `hit` leading pages
  // held, `missed` pages after them, all counted under `outcome`, the
  // first miss's reason (PrefixIndex::Miss as an int; kNone: the whole
  // prompt was held): driftkv_prefix_lookups_total{outcome} and
  // driftkv_prefix_lookup_pages_total{outcome}, the hit pages under
  // outcome="hit"; with `per_tenant`, also per tenant.
  void RecordLookup(const std::string& tenant, int outcome, uint64_t hit, uint64_t missed);
  // The outcome label of RecordLookup's `outcome`.
  static const char* LookupOutcomeName(int outcome);

  // By stream kind (label stream="key"/"value").
  prometheus::Histogram* budget_utilization[2];
  prometheus::Counter* symbols_coded[2];
  prometheus::Counter* symbols_moved[2];
  prometheus::Counter* encode_retries[2];
  prometheus::Counter* encode_fallbacks[2];
  prometheus::Counter* pages_encoded;

  prometheus::Gauge* pool_capacity_bytes;
  prometheus::Gauge* pool_bytes_in_use;
  prometheus::Gauge* pool_capacity_pages;
  prometheus::Gauge* pool_pages_in_use;
  // Per device of the server (label device="0", ...; one on a
  // single-device server): gauges added by the handler for its devices.
  prometheus::Family<prometheus::Gauge>* device_capacity_pages;
  prometheus::Family<prometheus::Gauge>* device_pages_in_use;
  prometheus::Family<prometheus::Gauge>* device_sequences;
  // The hot tier's share of each device (no series without a hot tier).
  prometheus::Family<prometheus::Gauge>* device_hot_capacity_pages;
  prometheus::Family<prometheus::Gauge>* device_hot_pages_in_use;
  prometheus::Gauge* tokens_compressed;  // driftkv_tokens_stored{form="compressed"}
  prometheus::Gauge* tokens_window;      // driftkv_tokens_stored{form="bf16_window"}
  prometheus::Gauge* window_bytes;
  prometheus::Gauge* sequences;
  prometheus::Counter* sequences_created;
  prometheus::Counter* sequences_released;
  prometheus::Counter* sequences_expired;
  prometheus::Counter* ingested_bytes;
  prometheus::Counter* ingested_tokens;
  prometheus::Counter* duplicate_tokens;
  prometheus::Counter* attention_tokens;
  prometheus::Counter* attention_items;
  // driftkv_attention_items_by_route_total{route}: items by how the backend
  // attended them (AttendRoute; none for kUnreported).
  prometheus::Counter* attention_items_by_route[static_cast<int>(AttendRoute::kCount)] = {};
  prometheus::Histogram* attend_batch_calls;  // backends/attend_batcher.h
  prometheus::Histogram* attend_batch_items;
  // driftkv_attend_phase_seconds{phase}: one Attend's time by phase
  // (backends/attend_phases.h).
  prometheus::Histogram* attend_phase_seconds[static_cast<int>(AttendPhase::kCount)];
  // driftkv_attend_device_seconds{stage}: one Attend's device time by
  // stage, observed only for calls whose backend timed them (DeviceStage).
  prometheus::Histogram* attend_device_seconds[static_cast<int>(DeviceStage::kCount)];
  // Records this thread's AttendPhaseClock: the phases, and the device
  // stages when the backend timed them.
  void RecordAttendPhases();
  prometheus::Counter* rejected_chunks;
  prometheus::Counter* integrity_rejections[kIntegrityReasons];  // by IntegrityReason
  prometheus::Counter* unauthenticated;                          // calls refused for a missing or unlisted token

  // The hot tier (docs/hot_tier.md, "Service"); zero without one.
  prometheus::Gauge* tier_pages[2];       // driftkv_pages{tier="cold"|"hot"}
  prometheus::Gauge* hot_capacity_bytes;  // the hot budget, whole level pages
  prometheus::Gauge* hot_capacity_pages;
  prometheus::Gauge* hot_layers;
  prometheus::Counter* tier_promotions;                   // layers
  prometheus::Counter* tier_promotions_skipped;           // no room even after demoting
  prometheus::Counter* tier_demotions[kDemotionReasons];  // layers, by DemotionReason
  prometheus::Counter* tier_pages_moved[2];               // direction="promote"|"demote"
  prometheus::Counter* tier_pages_encoded_hot;            // of the promoted: new pages straight to level form
  prometheus::Gauge* tier_cold_copies;                    // pages: cold copies of hot layers' pages
  prometheus::Counter* tier_pages_demoted_from_copies;    // of the demoted: a kept cold copy, not coded
  prometheus::Counter* tier_cold_copies_reclaimed;        // pages of copies the pool took back
  prometheus::Histogram* tier_promotion_seconds;          // per layer promoted
  prometheus::Histogram* tier_promotion_backend_seconds;  // of which the backend's move

  // Integrity and warm restart (docs/reliability.md).
  // driftkv_page_checksum_failures_total{where="read"|"attend"|"demote"|"snapshot"|"promote"|"window"},
  // by ChecksumSite (service/page_verifier.h).
  prometheus::Counter* checksum_failures[6];
  prometheus::Counter* snapshot_corrupt_pages;      // found at load
  prometheus::Counter* snapshot_dropped_sequences;  // not restored at load
  prometheus::Counter* snapshot_restored_sequences;
  prometheus::Gauge* draining;  // 1 from SIGTERM until exit

  // The prefix index (docs/prefix_cache.md).
  prometheus::Gauge* prefix_index_pages;     // (page key, layer) entries, each holding a cold page
  prometheus::Counter* prefix_evictions;     // entries evicted for room
  prometheus::Counter* prefix_pages_forked;  // pages shared by Fork from a prefix, all layers
  prometheus::Gauge* prefix_pinned_pages;    // page references held by pins, all layers

 private:
  // Buckets of budget_utilization.
  const prometheus::Histogram::BucketBoundaries utilization_bounds_ = {0.80, 0.85, 0.90, 0.92,  0.94, 0.96,
                                                                       0.97, 0.98, 0.99, 0.995, 1.0};
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* rpc_seconds_;
  prometheus::Family<prometheus::Gauge>* tenant_pages_ = nullptr;  // null unless per_tenant
  prometheus::Family<prometheus::Gauge>* tenant_sequences_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tenant_bytes_ = nullptr;
  // driftkv_prefix_lookups_total / _lookup_pages_total by outcome
  // (kLookupOutcomes labels: "hit" and the miss reasons), and per tenant.
  static constexpr int kLookupOutcomes = 6;
  prometheus::Counter* lookups_[kLookupOutcomes] = {};
  prometheus::Counter* lookup_pages_[kLookupOutcomes] = {};
  prometheus::Family<prometheus::Counter>* tenant_lookups_ = nullptr;  // null unless per_tenant
  prometheus::Family<prometheus::Counter>* tenant_lookup_pages_ = nullptr;
  absl::Mutex mu_;  // guards lazily added label sets of rpc_seconds_ and tenant_*
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_METRICS_H_
