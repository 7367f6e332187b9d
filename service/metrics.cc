#include "service/metrics.h"

#include <algorithm>
#include <vector>

namespace driftkv {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

constexpr const char* kStream[2] = {"key", "value"};

}  // namespace

Metrics::Metrics(bool per_tenant) : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  auto& util = BuildHistogram()
                   .Name("driftkv_budget_utilization_ratio")
                   .Help(
                       "rANS bytes used / container budget per encoded page (mean over the "
                       "page's streams), by stream")
                   .Register(r);
  auto& coded = BuildCounter()
                    .Name("driftkv_symbols_coded_total")
                    .Help("Quantisation symbols entropy-coded, by stream")
                    .Register(r);
  auto& moved = BuildCounter()
                    .Name("driftkv_symbols_moved_total")
                    .Help("Symbols moved off their nearest level by drift, by stream")
                    .Register(r);
  auto& retries = BuildCounter()
                      .Name("driftkv_encode_retries_total")
                      .Help("Stream re-solves because the real rANS length overflowed, by stream")
                      .Register(r);
  auto& fallbacks = BuildCounter()
                        .Name("driftkv_encode_fallbacks_total")
                        .Help("Streams that needed the cheapest-level fallback, by stream")
                        .Register(r);
  const Histogram::BucketBoundaries& ratio = utilization_bounds_;
  for (int s = 0; s < 2; ++s) {
    budget_utilization[s] = &util.Add({{"stream", kStream[s]}}, ratio);
    symbols_coded[s] = &coded.Add({{"stream", kStream[s]}});
    symbols_moved[s] = &moved.Add({{"stream", kStream[s]}});
    encode_retries[s] = &retries.Add({{"stream", kStream[s]}});
    encode_fallbacks[s] = &fallbacks.Add({{"stream", kStream[s]}});
  }
  pages_encoded = &BuildCounter()
                       .Name("driftkv_pages_encoded_total")
                       .Help("Pages encoded from the bf16 window")
                       .Register(r)
                       .Add({});

  pool_capacity_bytes =
      &BuildGauge().Name("driftkv_pool_capacity_bytes").Help("Bytes of the page arena").Register(r).Add({});
  pool_bytes_in_use = &BuildGauge()
                           .Name("driftkv_pool_used_bytes")
                           .Help("Bytes of the page arena held by pages in use")
                           .Register(r)
                           .Add({});
  pool_capacity_pages =
      &BuildGauge().Name("driftkv_pool_capacity_pages").Help("Pages in the arena").Register(r).Add({});
  pool_pages_in_use = &BuildGauge().Name("driftkv_pool_used_pages").Help("Pages in use").Register(r).Add({});
  device_capacity_pages = &BuildGauge()
                               .Name("driftkv_device_capacity_pages")
                               .Help("Pages of the arena on each device, by device")
                               .Register(r);
  device_pages_in_use =
      &BuildGauge().Name("driftkv_device_used_pages").Help("Pages in use on each device, by device").Register(r);
  device_sequences = &BuildGauge()
                          .Name("driftkv_device_sequences")
                          .Help("Live sequences placed on each device, by device")
                          .Register(r);
  device_hot_capacity_pages = &BuildGauge()
                                   .Name("driftkv_device_hot_capacity_pages")
                                   .Help("Level pages of the hot tier on each device, by device")
                                   .Register(r);
  device_hot_pages_in_use = &BuildGauge()
                                 .Name("driftkv_device_hot_used_pages")
                                 .Help("Level pages of the hot tier in use on each device, by device")
                                 .Register(r);
  auto& stored = BuildGauge()
                     .Name("driftkv_tokens_stored")
                     .Help("Tokens stored over all sequences and layers, by form")
                     .Register(r);
  tokens_compressed = &stored.Add({{"form", "compressed"}});
  tokens_window = &stored.Add({{"form", "bf16_window"}});
  window_bytes = &BuildGauge()
                      .Name("driftkv_window_bytes")
                      .Help("Bytes of bf16 keys and values held by the windows")
                      .Register(r)
                      .Add({});
  sequences = &BuildGauge().Name("driftkv_sequences").Help("Live sequences").Register(r).Add({});
  sequences_created = &BuildCounter()
                           .Name("driftkv_sequences_created_total")
                           .Help("Sequences created by a first chunk or by a Fork")
                           .Register(r)
                           .Add({});
  prefix_index_pages = &BuildGauge()
                            .Name("driftkv_prefix_index_pages")
                            .Help("Pages the prefix index holds (one per page key and layer), cached or shared")
                            .Register(r)
                            .Add({});
  prefix_evictions = &BuildCounter()
                          .Name("driftkv_prefix_evictions_total")
                          .Help("Prefix index pages evicted to make room (LRU, pages no sequence holds)")
                          .Register(r)
                          .Add({});
  prefix_pages_forked = &BuildCounter()
                             .Name("driftkv_prefix_pages_forked_total")
                             .Help("Pages shared by Fork from a prefix, all layers")
                             .Register(r)
                             .Add({});
  prefix_pinned_pages = &BuildGauge()
                             .Name("driftkv_prefix_pinned_pages")
                             .Help("Page references held by pins (Pin RPC), all layers; never evicted")
                             .Register(r)
                             .Add({});
  sequences_released =
      &BuildCounter().Name("driftkv_sequences_released_total").Help("Sequences freed by Release").Register(r).Add({});
  sequences_expired = &BuildCounter()
                           .Name("driftkv_sequences_expired_total")
                           .Help("Sequences freed after idling longer than the TTL")
                           .Register(r)
                           .Add({});
  ingested_bytes = &BuildCounter()
                        .Name("driftkv_ingested_bytes_total")
                        .Help("Raw key+value bytes of new tokens received")
                        .Register(r)
                        .Add({});
  ingested_tokens =
      &BuildCounter().Name("driftkv_ingested_tokens_total").Help("New tokens stored (per layer)").Register(r).Add({});
  duplicate_tokens = &BuildCounter()
                          .Name("driftkv_duplicate_tokens_total")
                          .Help("Tokens received again and acknowledged without storing")
                          .Register(r)
                          .Add({});
  rejected_chunks = &BuildCounter()
                         .Name("driftkv_rejected_requests_total")
                         .Help("Append chunks and Attend requests rejected")
                         .Register(r)
                         .Add({});
  auto& integrity = BuildCounter()
                        .Name("driftkv_integrity_rejections_total")
                        .Help(
                            "Append chunks and decode steps refused by an integrity check, by reason "
                            "(also counted in driftkv_rejected_requests_total)")
                        .Register(r);
  integrity_rejections[kRejectCrc32c] = &integrity.Add({{"reason", "crc32c"}});
  integrity_rejections[kRejectRepeat] = &integrity.Add({{"reason", "repeat_mismatch"}});
  integrity_rejections[kRejectTombstone] = &integrity.Add({{"reason", "tombstone"}});
  unauthenticated = &BuildCounter()
                         .Name("driftkv_unauthenticated_total")
                         .Help("Calls refused for a missing or unlisted bearer token (any service of the port)")
                         .Register(r)
                         .Add({});
  attention_tokens = &BuildCounter()
                          .Name("driftkv_attention_tokens_total")
                          .Help("Tokens attended over (sum over items)")
                          .Register(r)
                          .Add({});
  attention_items =
      &BuildCounter().Name("driftkv_attention_items_total").Help("Attention items computed").Register(r).Add({});
  auto& by_route = BuildCounter()
                       .Name("driftkv_attention_items_by_route_total")
                       .Help(
                           "Attention items by how the backend attended them: hot (level pages), cold_levels "
                           "(cold pages promoted into the device scratch), cold_fused (the fused cold kernel), "
                           "cold_host (the CPU backend)")
                       .Register(r);
  for (int k = 1; k < static_cast<int>(AttendRoute::kCount); ++k) {
    attention_items_by_route[k] = &by_route.Add({{"route", AttendRouteName(static_cast<AttendRoute>(k))}});
  }
  attend_batch_calls = &BuildHistogram()
                            .Name("driftkv_attend_batch_calls")
                            .Help(
                                "Attend calls merged into one backend call (one kernel launch on the "
                                "cuda backend); backends that run calls separately observe nothing")
                            .Register(r)
                            .Add({}, Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64});
  attend_batch_items = &BuildHistogram()
                            .Name("driftkv_attend_batch_items")
                            .Help("Attention items per merged backend call")
                            .Register(r)
                            .Add({}, Histogram::BucketBoundaries{1, 4, 16, 64, 256, 1024, 4096});
  auto& phases = BuildHistogram()
                     .Name("driftkv_attend_phase_seconds")
                     .Help(
                         "Wall time of one Attend by phase: validate, client_read, state, backend_host, "
                         "device_wait, finish (their sum is the Handler's time)")
                     .Register(r);
  for (int p = 0; p < static_cast<int>(AttendPhase::kCount); ++p) {
    attend_phase_seconds[p] = &phases.Add({{"phase", AttendPhaseName(static_cast<AttendPhase>(p))}},
                                          Histogram::BucketBoundaries{0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
                                                                      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1});
  }
  auto& device = BuildHistogram()
                     .Name("driftkv_attend_device_seconds")
                     .Help(
                         "Device time of one Attend by stage (inputs, attention, outputs) and the device's span "
                         "from the first call's start to the last one's end; only with DRIFTKV_DEVICE_TIMING=1 "
                         "on the cuda backend")
                     .Register(r);
  for (int s = 0; s < static_cast<int>(DeviceStage::kCount); ++s) {
    attend_device_seconds[s] = &device.Add({{"stage", DeviceStageName(static_cast<DeviceStage>(s))}},
                                           Histogram::BucketBoundaries{0.000005, 0.00001, 0.000025, 0.00005, 0.0001,
                                                                       0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1});
  }
  auto& tier_pages_family = BuildGauge()
                                .Name("driftkv_pages")
                                .Help("Pages in use, by tier (cold: D-Quant pages; hot: level pages)")
                                .Register(r);
  tier_pages[0] = &tier_pages_family.Add({{"tier", "cold"}});
  tier_pages[1] = &tier_pages_family.Add({{"tier", "hot"}});
  hot_capacity_bytes = &BuildGauge()
                            .Name("driftkv_hot_tier_capacity_bytes")
                            .Help("Bytes of the hot tier's pool of level pages (0: no hot tier)")
                            .Register(r)
                            .Add({});
  hot_capacity_pages =
      &BuildGauge().Name("driftkv_hot_tier_capacity_pages").Help("Level pages the hot tier holds").Register(r).Add({});
  hot_layers = &BuildGauge()
                    .Name("driftkv_hot_layers")
                    .Help("(sequence, layer)s whose pages are in the hot tier")
                    .Register(r)
                    .Add({});
  tier_promotions = &BuildCounter()
                         .Name("driftkv_tier_promotions_total")
                         .Help("Layers promoted from the cold to the hot tier")
                         .Register(r)
                         .Add({});
  tier_promotions_skipped = &BuildCounter()
                                 .Name("driftkv_tier_promotions_skipped_total")
                                 .Help(
                                     "Promotions not done for lack of hot pages even after demoting "
                                     "(the layer was attended cold)")
                                 .Register(r)
                                 .Add({});
  auto& demotions = BuildCounter()
                        .Name("driftkv_tier_demotions_total")
                        .Help("Layers demoted from the hot to the cold tier, by reason")
                        .Register(r);
  tier_demotions[kDemoteBudget] = &demotions.Add({{"reason", "budget"}});
  tier_demotions[kDemoteIdle] = &demotions.Add({{"reason", "idle"}});
  tier_demotions[kDemoteAppend] = &demotions.Add({{"reason", "append"}});
  tier_demotions[kDemoteDrain] = &demotions.Add({{"reason", "drain"}});
  auto& pages_moved = BuildCounter()
                          .Name("driftkv_tier_pages_moved_total")
                          .Help("Pages moved between the tiers, by direction")
                          .Register(r);
  tier_pages_moved[0] = &pages_moved.Add({{"direction", "promote"}});
  tier_pages_moved[1] = &pages_moved.Add({{"direction", "demote"}});
  tier_pages_encoded_hot = &BuildCounter()
                                .Name("driftkv_tier_pages_encoded_hot_total")
                                .Help("New pages of hot layers encoded straight into level pages (of the promoted)")
                                .Register(r)
                                .Add({});
  tier_cold_copies = &BuildGauge()
                          .Name("driftkv_tier_cold_copies_pages")
                          .Help(
                              "Cold pages kept as copies of hot layers' pages (a cache: counted in "
                              "driftkv_pool_used_pages, taken back when the pool falls short)")
                          .Register(r)
                          .Add({});
  tier_pages_demoted_from_copies = &BuildCounter()
                                        .Name("driftkv_tier_pages_demoted_from_copies_total")
                                        .Help("Demoted pages whose kept cold copy was used instead of coding them")
                                        .Register(r)
                                        .Add({});
  tier_cold_copies_reclaimed = &BuildCounter()
                                    .Name("driftkv_tier_cold_copies_reclaimed_total")
                                    .Help("Pages of cold copies the cold pool took back for room")
                                    .Register(r)
                                    .Add({});
  const Histogram::BucketBoundaries promotion_buckets{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.25,   1.0};
  tier_promotion_seconds = &BuildHistogram()
                                .Name("driftkv_tier_promotion_seconds")
                                .Help(
                                    "Time of one promotion step (one layer, or an Attend's cold layers together), "
                                    "including demotions to make room")
                                .Register(r)
                                .Add({}, promotion_buckets);
  tier_promotion_backend_seconds =
      &BuildHistogram()
           .Name("driftkv_tier_promotion_backend_seconds")
           .Help(
               "Of a promotion step, the backend's move of its pages (on cuda: the upload of the page lists, the "
               "cold checksums, the promotion kernel, the level checksums and one synchronisation)")
           .Register(r)
           .Add({}, promotion_buckets);
  auto& lookups = BuildCounter()
                      .Name("driftkv_prefix_lookups_total")
                      .Help("Lookups by outcome: hit (every page held) or the first missing page's reason")
                      .Register(r);
  auto& lookup_pages = BuildCounter()
                           .Name("driftkv_prefix_lookup_pages_total")
                           .Help("Prompt pages of Lookups: held (outcome hit), or missing, by the first miss's reason")
                           .Register(r);
  for (int o = 0; o < kLookupOutcomes; ++o) {
    lookups_[o] = &lookups.Add({{"outcome", LookupOutcomeName(o)}});
    lookup_pages_[o] = &lookup_pages.Add({{"outcome", LookupOutcomeName(o)}});
  }
  if (per_tenant) {
    tenant_lookups_ = &BuildCounter()
                           .Name("driftkv_tenant_prefix_lookups_total")
                           .Help("driftkv_prefix_lookups_total of each tenant (only with tokens)")
                           .Register(r);
    tenant_lookup_pages_ = &BuildCounter()
                                .Name("driftkv_tenant_prefix_lookup_pages_total")
                                .Help("driftkv_prefix_lookup_pages_total of each tenant (only with tokens)")
                                .Register(r);
  }
  if (per_tenant) {
    tenant_pages_ = &BuildGauge()
                         .Name("driftkv_tenant_pages")
                         .Help("Pages (both tiers) held by each tenant's sequences (only with tokens)")
                         .Register(r);
    tenant_sequences_ = &BuildGauge()
                             .Name("driftkv_tenant_sequences")
                             .Help("Live sequences of each tenant (only with tokens)")
                             .Register(r);
    tenant_bytes_ = &BuildGauge()
                         .Name("driftkv_tenant_bytes")
                         .Help(
                             "Bytes held by each tenant: cold and hot pages at their page size, bf16 windows "
                             "(the quantity tenant_max_bytes limits; only with tokens)")
                         .Register(r);
  }
  auto& checksum = BuildCounter()
                       .Name("driftkv_page_checksum_failures_total")
                       .Help(
                           "Pages and bf16 window tokens whose CRC-32C did not match their stored checksum, by "
                           "where it was checked")
                       .Register(r);
  const char* where[6] = {"read", "attend", "demote", "snapshot", "promote", "window"};  // ChecksumSite order
  for (int i = 0; i < 6; ++i) checksum_failures[i] = &checksum.Add({{"where", where[i]}});
  auto& snapshot = BuildCounter()
                       .Name("driftkv_snapshot_sequences_total")
                       .Help("Sequences of the snapshot loaded at start, by outcome")
                       .Register(r);
  snapshot_restored_sequences = &snapshot.Add({{"outcome", "restored"}});
  snapshot_dropped_sequences = &snapshot.Add({{"outcome", "dropped"}});
  snapshot_corrupt_pages = &BuildCounter()
                                .Name("driftkv_snapshot_corrupt_pages_total")
                                .Help("Pages and windows of the snapshot loaded at start that failed their checksum")
                                .Register(r)
                                .Add({});
  draining = &BuildGauge()
                  .Name("driftkv_draining")
                  .Help("1 while the server drains (SIGTERM until exit), else 0")
                  .Register(r)
                  .Add({});
  rpc_seconds_ = &BuildHistogram()
                      .Name("driftkv_rpc_duration_seconds")
                      .Help("RPC latency by method and gRPC status code")
                      .Register(r);
}

void Metrics::RecordPage(const CodecStats& stats, const std::vector<float>& key_util,
                         const std::vector<float>& value_util) {
  const StreamStats* s[2] = {&stats.keys, &stats.values};
  const std::vector<float>* each[2] = {&key_util, &value_util};
  for (int i = 0; i < 2; ++i) {
    if (!each[i]->empty()) {
      // One histogram update per page (a large chunk has 10^5 streams):
      // counts by bucket, with Observe's rule (the first bound >= u).
      std::vector<double> counts(utilization_bounds_.size() + 1, 0.0);
      double sum = 0.0;
      for (float u : *each[i]) {
        const size_t b = std::lower_bound(utilization_bounds_.begin(), utilization_bounds_.end(), double{u}) -
                         utilization_bounds_.begin();
        counts[b] += 1.0;
        sum += u;
      }
      budget_utilization[i]->ObserveMultiple(counts, sum);
    } else if (s[i]->bytes_budget > 0) {
      budget_utilization[i]->Observe(static_cast<double>(s[i]->bytes_used) / s[i]->bytes_budget);
    }
    symbols_coded[i]->Increment(static_cast<double>(s[i]->symbols));
    symbols_moved[i]->Increment(static_cast<double>(s[i]->moved));
    encode_retries[i]->Increment(static_cast<double>(s[i]->retries));
    encode_fallbacks[i]->Increment(static_cast<double>(s[i]->fallbacks));
  }
  pages_encoded->Increment();
}

void Metrics::RecordAttendPhases() {
  const AttendPhaseClock::Totals& totals = AttendPhaseClock::totals();
  for (size_t p = 0; p < totals.size(); ++p) attend_phase_seconds[p]->Observe(1e-9 * static_cast<double>(totals[p]));
  if (!AttendPhaseClock::device_timed()) return;
  const AttendPhaseClock::DeviceTotals& device = AttendPhaseClock::device_totals();
  for (size_t s = 0; s < device.size(); ++s) attend_device_seconds[s]->Observe(1e-9 * static_cast<double>(device[s]));
}

void Metrics::RecordRpc(const std::string& method, const std::string& code, double seconds) {
  static const Histogram::BucketBoundaries kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                       0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
  prometheus::Histogram* h;
  {
    // Family::Add returns the existing metric for known labels.
    absl::MutexLock lock(&mu_);
    h = &rpc_seconds_->Add({{"method", method}, {"code", code}}, kBuckets);
  }
  h->Observe(seconds);
}

void Metrics::SetTenant(const std::string& tenant, double pages, double sequences, double bytes) {
  if (tenant_pages_ == nullptr) return;
  prometheus::Gauge *p, *s, *b;
  {
    absl::MutexLock lock(&mu_);
    p = &tenant_pages_->Add({{"tenant", tenant}});
    s = &tenant_sequences_->Add({{"tenant", tenant}});
    b = &tenant_bytes_->Add({{"tenant", tenant}});
  }
  p->Set(pages);
  s->Set(sequences);
  b->Set(bytes);
}

const char* Metrics::LookupOutcomeName(int outcome) {
  // PrefixIndex::Miss's order; kNone is a whole hit.
  static constexpr const char* kNames[kLookupOutcomes] = {"hit",      "never_stored", "evicted",
                                                          "unhashed", "diverged",     "other_namespace"};
  return outcome >= 0 && outcome < kLookupOutcomes ? kNames[outcome] : "never_stored";
}

void Metrics::RecordLookup(const std::string& tenant, int outcome, uint64_t hit, uint64_t missed) {
  if (outcome < 0 || outcome >= kLookupOutcomes) outcome = 1;
  lookups_[outcome]->Increment();
  if (hit > 0) lookup_pages_[0]->Increment(static_cast<double>(hit));
  if (missed > 0) lookup_pages_[outcome]->Increment(static_cast<double>(missed));
  if (tenant_lookups_ == nullptr) return;
  prometheus::Counter *calls, *held, *lost;
  {
    absl::MutexLock lock(&mu_);
    const char* name = LookupOutcomeName(outcome);
    calls = &tenant_lookups_->Add({{"tenant", tenant}, {"outcome", name}});
    held = &tenant_lookup_pages_->Add({{"tenant", tenant}, {"outcome", "hit"}});
    lost = &tenant_lookup_pages_->Add({{"tenant", tenant}, {"outcome", name}});
  }
  calls->Increment();
  if (hit > 0) held->Increment(static_cast<double>(hit));
  if (missed > 0) lost->Increment(static_cast<double>(missed));
}

}  // namespace driftkv
