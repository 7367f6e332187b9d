// Handler::Release, idle expiry, the gauges, Info and Stats.
#include "service/handler.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "wire/tensor.h"

namespace driftkv {

absl::Status Handler::Release(const v1::ReleaseRequest& request, v1::ReleaseResponse* response,
                              const std::string& tenant) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (!st.ok()) return st;
  uint64_t tokens = 0, pages = 0;
  st = table_->Release(TenantKey(tenant, request.sequence_id()), request.sequence_id(), &tokens, &pages);
  if (!st.ok()) return st;
  response->set_tokens_freed(tokens);
  response->set_pages_freed(pages);
  response->set_tombstone_seconds(options_.tombstone_seconds);
  PublishGauges();
  return absl::OkStatus();
}

int Handler::ExpireIdle() {
  table_->PurgeTombstones();
  if (hot_ != nullptr && hot_->DemoteIdle()) PublishGauges();
  const int expired = table_->ExpireIdle();
  const int pins_ended = pins_->Expire(clock_());
  if (expired > 0 || pins_ended > 0) PublishGauges();
  return expired;
}

void Handler::PublishGauges() {
  const int64_t in_use = pool_->pages_in_use();
  metrics_->pool_pages_in_use->Set(static_cast<double>(in_use));
  metrics_->pool_bytes_in_use->Set(static_cast<double>(in_use) * pool_->page_stride());
  table_->PublishGauges();
  metrics_->tier_pages[0]->Set(static_cast<double>(in_use));
  if (hot_ != nullptr) hot_->PublishGauges();
  if (index_ != nullptr) metrics_->prefix_index_pages->Set(static_cast<double>(index_->entries()));
  if (pins_ != nullptr) metrics_->prefix_pinned_pages->Set(static_cast<double>(pins_->pages()));
}

void Handler::Info(v1::InfoResponse* r, const std::string& tenant) const {
  const KvCodec::Settings c = codec_->settings();
  r->set_server_version(kServerVersion);
  r->set_backend(backend_->name());
  r->set_layers(options_.layers);
  r->set_kv_heads(codec_->kv_heads());
  r->set_head_dim(codec_->head_dim());
  r->set_codec(codec_->name());
  r->set_page_format(options_.page_format);
  r->set_key_levels(c.key_levels);
  r->set_value_levels(c.value_levels);
  r->set_key_payload_bytes(c.key_payload_bytes);
  r->set_value_payload_bytes(c.value_payload_bytes);
  r->set_alpha(c.alpha);
  r->set_value_refit(c.value_refit);
  r->set_page_tokens(pool_->page_tokens());
  r->set_window_tokens(options_.window_tokens);
  r->set_page_bytes(pool_->page_stride());
  r->set_capacity_pages(pool_->capacity_pages());
  r->set_capacity_bytes(pool_->capacity_bytes());
  r->clear_devices();
  const std::vector<int>& device_ids = table_->device_ids();
  for (size_t k = 0; k < device_ids.size(); ++k) {
    v1::DeviceInfo* d = r->add_devices();
    const int64_t pages = pool_->partition_begin(static_cast<int>(k) + 1) - pool_->partition_begin(static_cast<int>(k));
    d->set_device(device_ids[k]);
    d->set_capacity_pages(pages);
    d->set_capacity_bytes(static_cast<uint64_t>(pages) * pool_->page_stride());
    if (hot_pool_ != nullptr) {
      const int64_t hot =
          hot_pool_->partition_begin(static_cast<int>(k) + 1) - hot_pool_->partition_begin(static_cast<int>(k));
      d->set_hot_capacity_pages(hot);
      d->set_hot_capacity_bytes(static_cast<uint64_t>(hot) * hot_pool_->page_stride());
    }
  }
  r->set_key_bits_per_value(codec_->key_bits_per_value());
  r->set_value_bits_per_value(codec_->value_bits_per_value());
  r->set_max_message_bytes(options_.max_message_bytes);
  r->set_max_batch(options_.max_batch);
  r->set_max_sequences(options_.max_sequences);
  r->set_ttl_seconds(options_.ttl_seconds);
  r->set_tombstone_seconds(options_.tombstone_seconds);
  r->set_tls(options_.tls());
  r->set_client_certificates(options_.client_certificates());
  r->set_tokens(options_.tokens != nullptr);
  r->set_transform(TransformName(options_.transform));
  if (options_.transforms != nullptr) {
    r->set_transforms_checksum(transforms_checksum_);
    r->set_transforms_calibration_tokens(options_.transforms->calibration_tokens);
    r->set_values_folded(options_.values_folded);
  }
  r->set_hot_tier(hot_pool_ != nullptr);
  if (hot_pool_ != nullptr) {
    r->set_hot_capacity_bytes(hot_pool_->capacity_bytes());
    r->set_hot_capacity_pages(hot_pool_->capacity_pages());
    r->set_hot_page_bytes(hot_pool_->page_stride());
    r->set_hot_promotion(HotPromotionName(options_.hot_promotion));
    r->set_hot_idle_seconds(options_.hot_idle_seconds);
    r->set_hot_keep_cold_copies(options_.hot_keep_cold_copies);
  }
  r->set_draining(draining());
  // Without tokens the one tenant "" holds every sequence.
  const TenantUsage* usage = table_->FindTenant(tenant);
  r->set_restored_sequences(usage != nullptr ? usage->restored() : 0);
  r->set_verify_pages_on_attend(options_.verify_pages_on_attend);
}

void Handler::Stats(v1::StatsResponse* r, const std::string& tenant) const {
  r->set_tenant(tenant);
  const TenantQuota quota = options_.QuotaOf(tenant);
  r->set_tenant_max_pages(quota.max_pages);
  r->set_tenant_max_sequences(quota.max_sequences);
  r->set_tenant_max_bytes(quota.max_bytes);
  // Without tokens the one tenant "" holds every sequence and tombstone, so
  // these are the whole server's figures there.
  if (const TenantUsage* u = table_->FindTenant(tenant); u != nullptr) {
    r->set_tenant_pages(u->pages());
    r->set_tenant_bytes(static_cast<uint64_t>(std::max<int64_t>(0, u->bytes())));
    r->set_tenant_sequences(u->sequences());
    r->set_sequences(u->sequences());
    r->set_sequences_released(u->released());
    r->set_sequences_expired(u->expired());
  }
  table_->PurgeTombstones();
  r->set_tombstones(table_->TenantTombstones(tenant));
  const int64_t in_use = pool_->pages_in_use();
  r->set_pages_in_use(in_use);
  r->set_capacity_pages(pool_->capacity_pages());
  r->set_bytes_in_use(static_cast<uint64_t>(in_use) * pool_->page_stride());
  r->set_capacity_bytes(pool_->capacity_bytes());
  r->clear_devices();
  const std::vector<int>& device_ids = table_->device_ids();
  for (size_t k = 0; k < device_ids.size(); ++k) {
    v1::DeviceStats* d = r->add_devices();
    const int64_t used = pool_->pages_in_use(static_cast<int>(k));
    d->set_device(device_ids[k]);
    d->set_pages_in_use(used);
    d->set_bytes_in_use(static_cast<uint64_t>(used) * pool_->page_stride());
    d->set_sequences(table_->device_sequences(static_cast<int>(k)));
    if (hot_pool_ != nullptr) {
      const int64_t hot = hot_pool_->pages_in_use(static_cast<int>(k));
      d->set_hot_pages_in_use(hot);
      d->set_hot_bytes_in_use(static_cast<uint64_t>(hot) * hot_pool_->page_stride());
      d->set_cold_copy_pages(static_cast<uint64_t>(hot_->cold_copy_pages(static_cast<int>(k))));
    }
  }
  r->set_tokens_compressed(table_->tokens_compressed());
  r->set_tokens_window(table_->tokens_window());
  r->set_window_bytes(static_cast<uint64_t>(4) * n() * table_->tokens_window());
  r->set_tokens_ingested(totals_.tokens_ingested.load());
  r->set_bytes_ingested(totals_.bytes_ingested.load());
  r->set_attention_tokens(totals_.attention_tokens.load());
  r->set_checksum_failures(verifier_->failures());
  r->set_snapshot_corrupt_pages(totals_.snapshot_corrupt_pages.load());
  r->set_snapshot_dropped_sequences(totals_.snapshot_dropped_sequences.load());
  if (hot_pool_ != nullptr) {
    const int64_t hot = hot_pool_->pages_in_use();
    r->set_hot_pages_in_use(hot);
    r->set_hot_capacity_pages(hot_pool_->capacity_pages());
    r->set_hot_bytes_in_use(static_cast<uint64_t>(hot) * hot_pool_->page_stride());
    r->set_hot_capacity_bytes(hot_pool_->capacity_bytes());
    r->set_hot_layers(hot_->layers());
    r->set_promotions(hot_->promotions());
    r->set_demotions(hot_->demotions());
    r->set_pages_promoted(hot_->pages_promoted());
    r->set_pages_demoted(hot_->pages_demoted());
    r->set_pages_encoded_hot(hot_->pages_encoded_hot());
    const int64_t copies = hot_->cold_copy_pages();
    r->set_cold_copy_pages(static_cast<uint64_t>(copies));
    r->set_cold_copy_bytes(static_cast<uint64_t>(copies) * pool_->page_stride());
    r->set_pages_demoted_from_copies(hot_->pages_demoted_from_copies());
  }
  absl::MutexLock lock(&totals_.codec_mu);
  r->set_symbols_key(totals_.codec.keys.symbols);
  r->set_symbols_moved_key(totals_.codec.keys.moved);
  r->set_symbols_value(totals_.codec.values.symbols);
  r->set_symbols_moved_value(totals_.codec.values.moved);
  r->set_encode_retries(totals_.codec.keys.retries + totals_.codec.values.retries);
}

}  // namespace driftkv
