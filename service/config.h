// The server's configuration: the ServerConfig text-format message of
// proto/config.proto, resolved into plain options with every default filled
// in and every field range-checked.
#ifndef DRIFTKV_SERVICE_CONFIG_H_
#define DRIFTKV_SERVICE_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/dquant_codec.h"
#include "codec/registry.h"
#include "codec/transform/transform.h"
#include "codec/transform/transforms_file.h"
#include "proto/config.pb.h"
#include "service/tenant.h"
#include "service/token_store.h"
#include "service/tokens.h"

namespace driftkv {
namespace tiers {
class FileIo;
}  // namespace tiers

constexpr int kDefaultWindowTokens = 128;
constexpr uint64_t kDefaultMaxSequences = 4096;
constexpr uint64_t kDefaultMaxMessageBytes = 64ull << 20;
constexpr int kDefaultMaxBatch = 1024;
constexpr int kDefaultAttendPollSpinUs = 200;
constexpr int kDefaultReadChunkTokens = 256;
constexpr int kMaxLayers = 4096;
constexpr int kMaxSequenceIdBytes = 256;
constexpr double kDefaultHotIdleSeconds = 60.0;
constexpr int kDefaultNcclMaxChannels = 8;
constexpr double kDefaultNcclChunkTimeoutSeconds = 30.0;
constexpr double kDefaultNcclIdleSeconds = 300.0;
constexpr uint64_t kDefaultNcclMaxChunkBytes = 2ull << 30;
constexpr double kDefaultTombstoneSeconds = 600.0;
constexpr double kDefaultDrainTimeoutSeconds = 15.0;
constexpr double kDefaultDrainNoticeSeconds = 2.0;
constexpr double kMaxDrainSeconds = 3600.0;
constexpr uint32_t kDefaultRegionSocketMode = 0600;
constexpr uint64_t kDefaultMaxRegionBytes = 1ull << 30;
constexpr uint64_t kDefaultMaxRegionBytesPerTenant = 4ull << 30;
constexpr uint32_t kDefaultMaxRegions = 64;
constexpr uint32_t kDefaultRegionLeaseSeconds = 60;
constexpr uint32_t kDefaultMaxRegionLeaseSeconds = 3600;
constexpr double kMaxReloadIntervalSeconds = 86400.0;

// The disk level below the pool (docs/tiers.md; config disk_level): off
// while `dir` is empty. At start the segment files are wiped, unless a
// drain's snapshot names their records and at_start is not "wipe"
// (docs/tiers.md, "Restart").
struct DiskLevelOptions {
  std::string dir;
  uint64_t budget_bytes = 0;
  uint64_t segment_bytes = uint64_t{128} << 20;
  bool power_loss = false;  // durability "power_loss": fdatasync per write batch
  // at_start "wipe": never kept for a snapshot (docs/tiers.md, "Restart").
  bool wipe_at_start = false;
  // Not from the config: the system calls on the level's files (null:
  // POSIX), for tests that make them fail. Must outlive the server.
  tiers::FileIo* io = nullptr;
  bool on() const { return !dir.empty(); }
};
constexpr uint64_t kMinDiskLevelBytes = uint64_t{1} << 20;
constexpr uint64_t kMinDiskSegmentBytes = uint64_t{256} << 10;

// The host-memory level between the pool and the disk level (docs/tiers.md;
// config host_level): off when budget_bytes is 0.
struct HostLevelOptions {
  uint64_t budget_bytes = 0;
  bool on() const { return budget_bytes > 0; }
};
constexpr uint64_t kMinHostLevelBytes = uint64_t{64} << 10;

// When the hot tier promotes a cold layer that an Attend asks for.
enum class HotPromotion { kSync, kAsync };

struct ServiceOptions {
  std::string listen = "0.0.0.0:50051";
  std::string metrics_listen = "0.0.0.0:9464";  // empty: no exposer
  std::string backend = "cpu";
  int layers = 0;
  // The codec by name (codec/registry.h) and its page representation
  // (backends/page_format.h), as the config's codec.name and
  // codec.page_format say; the handler builds them through their
  // interfaces and the backend refuses what it does not serve.
  std::string codec_name = "dquant";
  std::string page_format = "container";
  DQuantConfig codec;  // kv_heads, head_dim, levels, bytes, alpha, mean_window
  uint64_t pool_bytes = 0;
  int window_tokens = kDefaultWindowTokens;  // R
  uint64_t max_sequences = kDefaultMaxSequences;
  double ttl_seconds = 0.0;  // 0: never expire
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  int max_batch = kDefaultMaxBatch;
  int read_chunk_tokens = kDefaultReadChunkTokens;
  int backend_threads = 0;      // 0: hardware concurrency (at most 16)
  bool attend_batching = true;  // backends/attend_batcher.h, where the backend prefers it
  // The polling door for Attend (service/attend_poller.h): 0 threads: off.
  int attend_poll_threads = 0;
  int attend_poll_spin_us = kDefaultAttendPollSpinUs;
  uint32_t grpc_read_chunk_bytes = 0;  // 0: gRPC's default
  // The transform stage (codec.transform). codec.hadamard is true exactly
  // for kHadamard. With kWush, `transforms` holds the set read from
  // `transforms_file` (shared: the handler keeps a reference for its
  // backend's lifetime) and values_folded may be set; otherwise both are
  // null/false. ValidateTransform checks these relations.
  TransformKind transform = TransformKind::kHadamard;
  std::string transforms_file;
  std::shared_ptr<const TransformSet> transforms;
  bool values_folded = false;
  // The hot tier (docs/hot_tier.md, "Service"), off when both budgets are
  // 0: hot_tier_bytes is added to pool_bytes; hot_tier_fraction of
  // pool_bytes is taken out of it. At most one is nonzero
  // (ValidateHotTier).
  uint64_t hot_tier_bytes = 0;
  double hot_tier_fraction = 0.0;
  double hot_idle_seconds = kDefaultHotIdleSeconds;  // 0: never demote for idling
  HotPromotion hot_promotion = HotPromotion::kSync;
  bool hot_keep_cold_copies = true;  // see proto/config.proto
  // NCCL ingest (docs/nccl.md, service/channels.h).
  int nccl_max_channels = kDefaultNcclMaxChannels;  // 0: no channel is accepted
  double nccl_chunk_timeout_seconds = kDefaultNcclChunkTimeoutSeconds;
  double nccl_idle_seconds = kDefaultNcclIdleSeconds;
  uint64_t nccl_max_chunk_bytes = kDefaultNcclMaxChunkBytes;
  // Devices of a multi-GPU server (config devices); empty: one device.
  std::vector<int> devices;
  // Transport security and tenants (docs/security.md). TLS when both
  // tls_cert_file and tls_key_file are set; mTLS with tls_client_ca_file
  // too. `tokens` (read from tokens_file; needs TLS) turns on bearer tokens:
  // every call then acts for the tenant its token names.
  std::string tls_cert_file, tls_key_file, tls_client_ca_file;
  std::string tokens_file;
  std::shared_ptr<const TokenTable> tokens;  // as read at start
  // The tokens in force once a reload may have replaced `tokens`, with
  // the tenant defaults resolved for them (DriftkvServer::Start makes it
  // from `tokens` and `tenant_defaults`); null: `tokens` holds.
  std::shared_ptr<TokenStore> token_store;
  // Every call's tenant must be its client certificate's subject CN
  // (needs tokens and mTLS; service/auth.h).
  bool tenant_from_certificate = false;
  // The watch of tokens_file and the TLS files (0: SIGHUP only).
  double reload_interval_seconds = 0.0;
  // The config's tenant_max_* as written (unset ones absent), and every
  // tenant's quotas resolved from them for `tokens` (with tokens, the
  // shares of service/tenant_quotas.h); a token line's max_*= overrides
  // them. A reload of tokens_file resolves them again for its tenants.
  TenantQuotaSettings tenant_settings;
  TenantQuota tenant_defaults;
  // The metrics port shows each tenant's figures (config
  // metrics_per_tenant; only with tokens). Off: no series names a tenant.
  bool metrics_per_tenant = false;
  std::string health_listen;                            // empty: health only on the main port
  double tombstone_seconds = kDefaultTombstoneSeconds;  // 0: none
  // Graceful drain and warm restart (docs/reliability.md; config
  // snapshot_dir, drain_*): empty snapshot_dir: no snapshot is written or read.
  std::string snapshot_dir;
  double drain_timeout_seconds = kDefaultDrainTimeoutSeconds;
  double drain_notice_seconds = kDefaultDrainNoticeSeconds;
  bool verify_pages_on_attend = false;  // Attend checks each page's and window token's CRC-32C
  // Memory regions (service/regions.h; config region_*, max_region*).
  std::string region_socket;  // empty: no host shared-memory regions
  uint32_t region_socket_mode = kDefaultRegionSocketMode;
  uint64_t max_region_bytes = kDefaultMaxRegionBytes;
  uint64_t max_region_bytes_per_tenant = kDefaultMaxRegionBytesPerTenant;  // 0: unlimited
  uint32_t max_regions = kDefaultMaxRegions;                               // per tenant
  uint32_t region_lease_seconds = kDefaultRegionLeaseSeconds;
  uint32_t max_region_lease_seconds = kDefaultMaxRegionLeaseSeconds;
  uint64_t device_window_cache_bytes = 0;  // 0: the backend's default
  int64_t device_cold_scratch_bytes = -1;  // -1: the backend's default; 0: none
  DiskLevelOptions disk_level;
  HostLevelOptions host_level;
  bool levels_below() const { return disk_level.on() || host_level.on(); }
  // Tenant -> the shared prefix namespace it is in (config
  // prefix_namespaces; service/prefix_namespaces.h). Absent: the
  // tenant's own.
  std::map<std::string, std::string> prefix_namespace_of;

  int page_tokens() const { return codec.mean_window; }
  bool tls() const { return !tls_cert_file.empty(); }
  bool client_certificates() const { return !tls_client_ca_file.empty(); }
  // The quotas of `tenant` in the tokens in force.
  TenantQuota QuotaOf(const std::string& tenant) const {
    if (token_store != nullptr) return token_store->QuotaOf(tenant);
    return tokens != nullptr ? tokens->QuotaOf(tenant, tenant_defaults) : tenant_defaults;
  }
  bool hot_tier() const { return hot_tier_bytes > 0 || hot_tier_fraction > 0.0; }
  // Bytes of the hot pool and of the cold pool (pool_bytes less the
  // fraction's share). REQUIRES: ValidateHotTier ok.
  uint64_t hot_budget_bytes() const;
  uint64_t cold_pool_bytes() const;
  // The codec's options for MakeKvCodec (the settings above; rotation
  // "hadamard" exactly when codec.hadamard).
  CodecOptions codec_options() const;
};

// Reads a text-format ServerConfig; the error names the file and the line.
absl::StatusOr<v1::ServerConfig> LoadConfigFile(const std::string& path);

// Reads tokens_file at `path` with the checks of a start: it parses, lists
// a token, and binds no certificate (cert=) unless `client_certificates`
// (mTLS is on). InvalidArgument naming the file and the line otherwise.
absl::StatusOr<TokenTable> ReadTokensFile(const std::string& path, bool client_certificates);

// Fills defaults and checks every field; InvalidArgument names the field
// and its value ("model.head_dim 96 must be a power of two ...").
absl::StatusOr<ServiceOptions> ResolveConfig(const v1::ServerConfig& config);

// Empty, or one line for stderr at start when the D-Quant codec of resolved
// options is outside its quality envelope (QualityEnvelopeWarning of
// codec/dquant_codec.h: key_bytes or value_bytes set below what codes 95%
// of the reference's bits per value; the defaults never are). Other
// codecs, and options whose codec does not build, give empty (the server's
// start reports the latter).
std::string QualityWarning(const ServiceOptions& options);

// "identity", "hadamard" or "wush".
const char* TransformName(TransformKind kind);

// The transform fields of resolved options agree with each other and with
// the model shape (see ServiceOptions::transform); InvalidArgument naming
// the config field otherwise. ResolveConfig and Handler::Create call it.
absl::Status ValidateTransform(const ServiceOptions& options);

// "sync" or "async".
const char* HotPromotionName(HotPromotion mode);

// The hot tier's fields are in range and not both budgets set;
// InvalidArgument naming the config field and its value otherwise.
// ResolveConfig and Handler::Create call it (whether the codec and the
// backend have a hot tier is checked by Handler::Create).
absl::Status ValidateHotTier(const ServiceOptions& options);

// The fields of the levels below the pool (host_level, disk_level) are in
// range and not combined with what they do not support yet (snapshot_dir);
// InvalidArgument naming the config field and its value otherwise.
// ResolveConfig and Handler::Create call it; nothing to check when both
// are off.
absl::Status ValidateLevels(const ServiceOptions& options);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_CONFIG_H_
