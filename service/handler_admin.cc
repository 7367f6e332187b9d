// Handler::Release, idle expiry, the gauges, Info and Stats.
#include "service/handler.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler_internal.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::Quoted;

absl::Status Handler::Release(const v1::ReleaseRequest& request, v1::ReleaseResponse* response,
                              const std::string& tenant) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (!st.ok()) return st;
  const std::string key = TenantKey(tenant, request.sequence_id());
  SequencePtr seq;
  {
    absl::MutexLock lock(&table_mu_);
    auto it = table_.find(key);
    if (it != table_.end()) {
      seq = it->second;
      // Tombstoned before it leaves the table (see FindOrCreate).
      tombstones_.Add(key, clock_());
      EraseLocked(it);
    }
  }
  if (seq == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found"));
  }
  uint64_t tokens = 0, pages = 0;
  {
    absl::MutexLock lock(&seq->mu);
    if (seq->released) {
      return absl::NotFoundError(
          absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found (released)"));
    }
    FreeLocked(seq.get(), &tokens, &pages);
    seq->released = true;
  }
  response->set_tokens_freed(tokens);
  response->set_pages_freed(pages);
  response->set_tombstone_seconds(options_.tombstone_seconds);
  ++sequences_released_;
  metrics_->sequences_released->Increment();
  PublishGauges();
  return absl::OkStatus();
}

int Handler::ExpireIdle() {
  tombstones_.Purge(clock_());
  if (hot_pool_ != nullptr && options_.hot_idle_seconds > 0.0) DemoteIdle();
  if (options_.ttl_seconds <= 0.0) return 0;
  const int64_t cutoff = absl::ToUnixNanos(clock_() - absl::Seconds(options_.ttl_seconds));
  std::vector<SequencePtr> idle;
  {
    absl::MutexLock lock(&table_mu_);
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
    ++expired;
  }
  if (expired > 0) {
    sequences_expired_ += expired;
    metrics_->sequences_expired->Increment(expired);
    PublishGauges();
  }
  return expired;
}

void Handler::PublishGauges() {
  const int64_t in_use = pool_->pages_in_use();
  metrics_->pool_pages_in_use->Set(static_cast<double>(in_use));
  metrics_->pool_bytes_in_use->Set(static_cast<double>(in_use) * pool_->page_stride());
  metrics_->tokens_compressed->Set(static_cast<double>(tokens_compressed_.load()));
  metrics_->tokens_window->Set(static_cast<double>(tokens_window_.load()));
  metrics_->window_bytes->Set(4.0 * n() * tokens_window_.load());
  size_t sequences;
  {
    absl::MutexLock lock(&table_mu_);
    sequences = table_.size();
  }
  metrics_->sequences->Set(static_cast<double>(sequences));
  for (size_t k = 0; k < device_ids_.size(); ++k) {
    device_used_gauges_[k]->Set(static_cast<double>(pool_->pages_in_use(static_cast<int>(k))));
    absl::MutexLock lock(&table_mu_);
    device_sequence_gauges_[k]->Set(static_cast<double>(device_sequences_[k]));
  }
  if (options_.tokens != nullptr) {
    ledger_.ForEach([this](const TenantUsage& u) {
      metrics_->SetTenant(u.name(), static_cast<double>(u.pages()), static_cast<double>(u.sequences()));
    });
  }
  metrics_->tier_pages[0]->Set(static_cast<double>(in_use));
  if (hot_pool_ != nullptr) {
    metrics_->tier_pages[1]->Set(static_cast<double>(hot_pool_->pages_in_use()));
    absl::MutexLock lock(&hot_mu_);
    metrics_->hot_layers->Set(static_cast<double>(hot_layers_.size()));
  }
}

void Handler::Info(v1::InfoResponse* r) const {
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
  for (size_t k = 0; k < device_ids_.size(); ++k) {
    v1::DeviceInfo* d = r->add_devices();
    const int64_t pages = pool_->partition_begin(static_cast<int>(k) + 1) - pool_->partition_begin(static_cast<int>(k));
    d->set_device(device_ids_[k]);
    d->set_capacity_pages(pages);
    d->set_capacity_bytes(static_cast<uint64_t>(pages) * pool_->page_stride());
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
  }
  r->set_draining(draining_.load());
  r->set_restored_sequences(restored_sequences_.load());
  r->set_verify_pages_on_attend(options_.verify_pages_on_attend);
}

void Handler::Stats(v1::StatsResponse* r, const std::string& tenant) const {
  r->set_tenant(tenant);
  const TenantQuota quota = options_.QuotaOf(tenant);
  r->set_tenant_max_pages(quota.max_pages);
  r->set_tenant_max_sequences(quota.max_sequences);
  if (const TenantUsage* u = ledger_.Find(tenant); u != nullptr) {
    r->set_tenant_pages(u->pages());
    r->set_tenant_sequences(u->sequences());
  }
  r->set_tombstones(tombstones_.Purge(clock_()));
  {
    absl::MutexLock lock(&table_mu_);
    r->set_sequences(table_.size());
  }
  const int64_t in_use = pool_->pages_in_use();
  r->set_pages_in_use(in_use);
  r->set_capacity_pages(pool_->capacity_pages());
  r->set_bytes_in_use(static_cast<uint64_t>(in_use) * pool_->page_stride());
  r->set_capacity_bytes(pool_->capacity_bytes());
  r->clear_devices();
  for (size_t k = 0; k < device_ids_.size(); ++k) {
    v1::DeviceStats* d = r->add_devices();
    const int64_t used = pool_->pages_in_use(static_cast<int>(k));
    d->set_device(device_ids_[k]);
    d->set_pages_in_use(used);
    d->set_bytes_in_use(static_cast<uint64_t>(used) * pool_->page_stride());
    absl::MutexLock lock(&table_mu_);
    d->set_sequences(device_sequences_[k]);
  }
  r->set_tokens_compressed(tokens_compressed_.load());
  r->set_tokens_window(tokens_window_.load());
  r->set_window_bytes(static_cast<uint64_t>(4) * n() * tokens_window_.load());
  r->set_sequences_expired(sequences_expired_.load());
  r->set_sequences_released(sequences_released_.load());
  r->set_tokens_ingested(tokens_ingested_.load());
  r->set_bytes_ingested(bytes_ingested_.load());
  r->set_attention_tokens(attention_tokens_.load());
  r->set_checksum_failures(checksum_failures_.load());
  r->set_snapshot_corrupt_pages(snapshot_corrupt_pages_.load());
  r->set_snapshot_dropped_sequences(snapshot_dropped_sequences_.load());
  if (hot_pool_ != nullptr) {
    const int64_t hot = hot_pool_->pages_in_use();
    r->set_hot_pages_in_use(hot);
    r->set_hot_capacity_pages(hot_pool_->capacity_pages());
    r->set_hot_bytes_in_use(static_cast<uint64_t>(hot) * hot_pool_->page_stride());
    r->set_hot_capacity_bytes(hot_pool_->capacity_bytes());
    {
      absl::MutexLock lock(&hot_mu_);
      r->set_hot_layers(hot_layers_.size());
    }
    r->set_promotions(promotions_.load());
    r->set_demotions(demotions_.load());
    r->set_pages_promoted(pages_promoted_.load());
    r->set_pages_demoted(pages_demoted_.load());
  }
  absl::MutexLock lock(&stats_mu_);
  r->set_symbols_key(codec_stats_.keys.symbols);
  r->set_symbols_moved_key(codec_stats_.keys.moved);
  r->set_symbols_value(codec_stats_.values.symbols);
  r->set_symbols_moved_value(codec_stats_.values.moved);
  r->set_encode_retries(codec_stats_.keys.retries + codec_stats_.values.retries);
}

}  // namespace driftkv
