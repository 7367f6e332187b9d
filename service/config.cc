#include "service/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/page_format.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "service/prefix_namespaces.h"
#include "service/tenant_quotas.h"

namespace driftkv {
namespace {

// Collects text-format parse errors so the status can carry them.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!errors.empty()) errors += "; ";
    absl::StrAppend(&errors, "line ", line + 1, " column ", column + 1, ": ", message);
  }
  std::string errors;
};

// Sets o's transform fields (and codec.hadamard) from c.codec, reading the
// transforms file for wush. REQUIRES: o->layers and o->codec's shape set.
absl::Status ResolveTransform(const v1::ServerConfig& c, ServiceOptions* o) {
  const v1::CodecSettings& s = c.codec();
  const std::string name = s.transform().empty() ? "hadamard" : s.transform();
  absl::StatusOr<TransformKind> kind = ParseTransformKind(name);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec.transform \"", name, "\" unknown; use identity, hadamard or wush"));
  }
  o->transform = *kind;
  o->codec.hadamard = *kind == TransformKind::kHadamard;
  if (*kind != TransformKind::kWush) {
    if (!s.transforms_file().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("codec.transforms_file \"", s.transforms_file(),
                                                     "\" is only used with codec.transform \"wush\", not \"", name,
                                                     "\""));
    }
    if (s.values_folded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("codec.values_folded true needs codec.transform \"wush\", not \"", name, "\""));
    }
    return absl::OkStatus();
  }
  if (s.transforms_file().empty()) {
    return absl::InvalidArgumentError(
        "codec.transforms_file is required with codec.transform \"wush\" (driftkv-calibrate writes it)");
  }
  absl::StatusOr<TransformSet> set = ReadTransformsFile(s.transforms_file());
  if (!set.ok()) {
    // Missing, unreadable and corrupt files alike are a bad config.
    return absl::InvalidArgumentError(absl::StrCat("codec.transforms_file: ", set.status().message()));
  }
  o->transforms_file = s.transforms_file();
  o->transforms = std::make_shared<const TransformSet>(*std::move(set));
  o->values_folded = s.values_folded();
  return ValidateTransform(*o);
}

}  // namespace

absl::StatusOr<TokenTable> ReadTokensFile(const std::string& path, bool client_certificates) {
  absl::StatusOr<TokenTable> table = TokenTable::ReadFile(path);
  if (!table.ok()) return table.status();
  if (table->size() == 0) return absl::InvalidArgumentError(absl::StrCat("tokens_file \"", path, "\" lists no token"));
  if (table->binds_certificates() && !client_certificates) {
    return absl::InvalidArgumentError(absl::StrCat("tokens_file \"", path,
                                                   "\" binds tokens to client certificates (cert=) and needs "
                                                   "tls_client_ca_file (mTLS)"));
  }
  return table;
}

namespace {

// The transport-security, tenant and tombstone fields.
absl::Status ResolveSecurity(const v1::ServerConfig& c, ServiceOptions* o) {
  o->tls_cert_file = c.tls_cert_file();
  o->tls_key_file = c.tls_key_file();
  o->tls_client_ca_file = c.tls_client_ca_file();
  if (o->tls_cert_file.empty() != o->tls_key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tls_cert_file \"", o->tls_cert_file, "\" and tls_key_file \"",
                                                   o->tls_key_file, "\": set both or neither"));
  }
  if (!o->tls_client_ca_file.empty() && o->tls_cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tls_client_ca_file \"", o->tls_client_ca_file,
                                                   "\" needs tls_cert_file and tls_key_file (mTLS is TLS)"));
  }
  for (const std::string* f : {&o->tls_cert_file, &o->tls_key_file, &o->tls_client_ca_file}) {
    if (!f->empty() && !std::ifstream(*f)) {
      return absl::InvalidArgumentError(absl::StrCat("TLS file \"", *f, "\" cannot be opened"));
    }
  }
  if (!c.tokens_file().empty()) {
    if (o->tls_cert_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tokens_file \"", c.tokens_file(),
                                                     "\" needs TLS (tls_cert_file, tls_key_file): bearer tokens are "
                                                     "never sent in plaintext"));
    }
    absl::StatusOr<TokenTable> table = ReadTokensFile(c.tokens_file(), o->client_certificates());
    if (!table.ok()) return table.status();
    o->tokens_file = c.tokens_file();
    o->tokens = std::make_shared<const TokenTable>(*std::move(table));
  }
  o->tenant_from_certificate = c.tenant_from_certificate();
  if (o->tenant_from_certificate && (o->tokens == nullptr || !o->client_certificates())) {
    return absl::InvalidArgumentError(
        "tenant_from_certificate needs tokens_file and tls_client_ca_file: the tenant comes from the token and "
        "must match the client certificate");
  }
  if (c.has_reload_interval_seconds()) {
    const double r = c.reload_interval_seconds();
    if (!(r >= 0.0 && r <= kMaxReloadIntervalSeconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("reload_interval_seconds ", r, " out of range [0, ", kMaxReloadIntervalSeconds, "]"));
    }
    o->reload_interval_seconds = r;
  }
  o->health_listen = c.health_listen();
  if (absl::Status st = ResolveTenantQuotas(c, o); !st.ok()) return st;
  if (absl::Status st = ResolvePrefixNamespaces(c, o); !st.ok()) return st;
  o->metrics_per_tenant = c.metrics_per_tenant();
  if (c.has_tombstone_seconds()) {
    if (!(c.tombstone_seconds() >= 0.0) || !std::isfinite(c.tombstone_seconds()) ||
        c.tombstone_seconds() > 86400 * 30) {
      return absl::InvalidArgumentError(
          absl::StrCat("tombstone_seconds ", c.tombstone_seconds(), " out of range [0, 2592000]"));
    }
    o->tombstone_seconds = c.tombstone_seconds();
  }
  return absl::OkStatus();
}

}  // namespace

const char* TransformName(TransformKind kind) {
  switch (kind) {
    case TransformKind::kIdentity: return "identity";
    case TransformKind::kHadamard: return "hadamard";
    case TransformKind::kWush: return "wush";
  }
  return "?";
}

const char* HotPromotionName(HotPromotion mode) {
  return mode == HotPromotion::kAsync ? "async" : "sync";
}

uint64_t ServiceOptions::hot_budget_bytes() const {
  if (hot_tier_fraction > 0.0) return static_cast<uint64_t>(hot_tier_fraction * static_cast<double>(pool_bytes));
  return hot_tier_bytes;
}

uint64_t ServiceOptions::cold_pool_bytes() const {
  return hot_tier_fraction > 0.0 ? pool_bytes - hot_budget_bytes() : pool_bytes;
}

absl::Status ValidateHotTier(const ServiceOptions& o) {
  if (!(o.hot_tier_fraction >= 0.0 && o.hot_tier_fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("hot_tier_fraction ", o.hot_tier_fraction, " out of range [0, 1)"));
  }
  if (o.hot_tier_bytes > 0 && o.hot_tier_fraction > 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("hot_tier_bytes ", o.hot_tier_bytes, " and hot_tier_fraction ",
                                                   o.hot_tier_fraction, " are both set; set one"));
  }
  if (!(o.hot_idle_seconds >= 0.0) || !std::isfinite(o.hot_idle_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hot_idle_seconds ", o.hot_idle_seconds, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTransform(const ServiceOptions& o) {
  const char* name = TransformName(o.transform);
  if (o.codec.hadamard != (o.transform == TransformKind::kHadamard)) {
    return absl::InvalidArgumentError(absl::StrCat("codec.transform \"", name, "\" needs the codec's own rotation ",
                                                   o.codec.hadamard ? "off" : "on"));
  }
  if (o.transform != TransformKind::kWush) {
    if (o.transforms != nullptr || o.values_folded) {
      return absl::InvalidArgumentError(absl::StrCat(
          "codec.transforms_file and codec.values_folded need codec.transform \"wush\", not \"", name, "\""));
    }
    return absl::OkStatus();
  }
  if (o.transforms == nullptr) {
    return absl::InvalidArgumentError("codec.transform \"wush\" needs codec.transforms_file");
  }
  const TransformSet& t = *o.transforms;
  const struct {
    const char* what;
    int file, model;
  } dims[] = {{"layers", t.layers, o.layers},
              {"kv_heads", t.kv_heads, o.codec.kv_heads},
              {"head_dim", t.head_dim, o.codec.head_dim}};
  for (const auto& d : dims) {
    if (d.file != d.model) {
      return absl::InvalidArgumentError(absl::StrCat("codec.transforms_file \"", o.transforms_file, "\" has ", d.what,
                                                     " ", d.file, " but model.", d.what, " is ", d.model));
    }
  }
  return absl::OkStatus();
}

std::string QualityWarning(const ServiceOptions& options) {
  if (options.codec_name != "dquant") return "";
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(options.codec);
  return codec.ok() ? QualityEnvelopeWarning(*codec) : "";
}

CodecOptions ServiceOptions::codec_options() const {
  CodecOptions o;
  o.name = codec_name;
  o.kv_heads = codec.kv_heads;
  o.head_dim = codec.head_dim;
  o.key_levels = codec.key_levels;
  o.value_levels = codec.value_levels;
  o.key_bytes = codec.key_bytes;
  o.value_bytes = codec.value_bytes;
  o.alpha = codec.alpha;
  o.mean_window = codec.mean_window;
  o.value_refit = codec.value_refit;
  o.rotation = codec.hadamard ? "hadamard" : "identity";
  return o;
}

absl::StatusOr<v1::ServerConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, " cannot be opened"));
  std::stringstream text;
  text << in.rdbuf();
  v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": ", errors.errors));
  }
  return config;
}

namespace {

// The memory-region fields (region_*, max_region*).
absl::Status ResolveRegions(const v1::ServerConfig& c, ServiceOptions* o) {
  o->region_socket = c.region_socket();
  if (o->region_socket.size() >= 108) {  // sizeof(sockaddr_un::sun_path)
    return absl::InvalidArgumentError(
        absl::StrCat("region_socket \"", c.region_socket(), "\" is longer than 107 bytes"));
  }
  if (c.has_region_socket_mode()) {
    if (c.region_socket_mode() > 0777 || (c.region_socket_mode() & 0600) != 0600) {
      return absl::InvalidArgumentError(absl::StrCat("region_socket_mode 0", absl::Hex(c.region_socket_mode()),
                                                     " must be within 0777 and include 0600"));
    }
    o->region_socket_mode = c.region_socket_mode();
  }
  if (c.has_max_region_bytes()) {
    if (c.max_region_bytes() < 4096 || c.max_region_bytes() > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_region_bytes ", c.max_region_bytes(), " out of range [4096, 2^40]"));
    }
    o->max_region_bytes = c.max_region_bytes();
  }
  if (c.has_max_region_bytes_per_tenant()) o->max_region_bytes_per_tenant = c.max_region_bytes_per_tenant();
  if (c.has_max_regions()) {
    if (c.max_regions() > 65536) {
      return absl::InvalidArgumentError(absl::StrCat("max_regions ", c.max_regions(), " out of range [0, 65536]"));
    }
    o->max_regions = c.max_regions();
  }
  if (c.has_device_window_cache_bytes()) o->device_window_cache_bytes = c.device_window_cache_bytes();
  if (c.has_device_cold_scratch_bytes()) {
    if (c.device_cold_scratch_bytes() > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_cold_scratch_bytes ", c.device_cold_scratch_bytes(), " exceeds 1 TiB"));
    }
    o->device_cold_scratch_bytes = static_cast<int64_t>(c.device_cold_scratch_bytes());
  }
  if (c.has_max_region_lease_seconds()) {
    if (c.max_region_lease_seconds() < 1 || c.max_region_lease_seconds() > 86400) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_region_lease_seconds ", c.max_region_lease_seconds(), " out of range [1, 86400]"));
    }
    o->max_region_lease_seconds = c.max_region_lease_seconds();
  }
  if (c.has_region_lease_seconds()) o->region_lease_seconds = c.region_lease_seconds();
  if (o->region_lease_seconds < 1 || o->region_lease_seconds > o->max_region_lease_seconds) {
    return absl::InvalidArgumentError(absl::StrCat("region_lease_seconds ", o->region_lease_seconds,
                                                   " out of range [1, max_region_lease_seconds ",
                                                   o->max_region_lease_seconds, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// config host_level and disk_level into o, with ValidateLevels' checks.
absl::Status ResolveLevels(const v1::ServerConfig& c, ServiceOptions* o) {
  if (c.has_host_level()) {
    o->host_level.budget_bytes = c.host_level().budget_bytes();
    if (o->host_level.budget_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat("host_level.budget_bytes 0 must be >= ", kMinHostLevelBytes));
    }
  }
  if (!c.has_disk_level()) return ValidateLevels(*o);
  const v1::DiskLevel& d = c.disk_level();
  if (d.dir().empty()) {
    return absl::InvalidArgumentError("disk_level.dir \"\": the disk level needs a directory");
  }
  if (!d.at_start().empty() && d.at_start() != "wipe" && d.at_start() != "snapshot") {
    return absl::InvalidArgumentError(
        absl::StrCat("disk_level.at_start \"", d.at_start(), "\" unknown; use snapshot or wipe (docs/tiers.md)"));
  }
  DiskLevelOptions& out = o->disk_level;
  out.wipe_at_start = d.at_start() == "wipe";
  out.dir = d.dir();
  out.budget_bytes = d.budget_bytes();
  if (d.has_segment_bytes()) out.segment_bytes = d.segment_bytes();
  if (d.durability() == "power_loss") {
    out.power_loss = true;
  } else if (!d.durability().empty() && d.durability() != "process") {
    return absl::InvalidArgumentError(
        absl::StrCat("disk_level.durability \"", d.durability(), "\" unknown; use process or power_loss"));
  }
  return ValidateLevels(*o);
}

}  // namespace

absl::StatusOr<ServiceOptions> ResolveConfig(const v1::ServerConfig& c) {
  ServiceOptions o;
  if (!c.listen().empty()) o.listen = c.listen();
  if (c.metrics_listen() == "none") {
    o.metrics_listen.clear();
  } else if (!c.metrics_listen().empty()) {
    o.metrics_listen = c.metrics_listen();
  }
  if (!c.backend().empty()) o.backend = c.backend();
  // The backend's name is checked against the registered backends when the
  // handler starts (backends/backend.h).
  if (c.model().layers() < 1 || c.model().layers() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.layers ", c.model().layers(), " out of range [1, ", kMaxLayers, "]"));
  }
  o.layers = static_cast<int>(c.model().layers());
  if (!c.codec().name().empty()) o.codec_name = c.codec().name();
  {
    const std::vector<std::string> names = KvCodecNames();
    if (std::find(names.begin(), names.end(), o.codec_name) == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("codec.name \"", o.codec_name, "\" unknown (known: ", absl::StrJoin(names, ", "), ")"));
    }
  }
  if (!c.codec().page_format().empty()) o.page_format = c.codec().page_format();
  {
    const std::vector<std::string> formats = PageFormatNames();
    if (std::find(formats.begin(), formats.end(), o.page_format) == formats.end()) {
      return absl::InvalidArgumentError(absl::StrCat("codec.page_format \"", o.page_format,
                                                     "\" unknown (known: ", absl::StrJoin(formats, ", "), ")"));
    }
  }
  DQuantConfig& q = o.codec;
  q.kv_heads = static_cast<int>(std::min<uint32_t>(c.model().kv_heads(), 1u << 20));
  q.head_dim = static_cast<int>(std::min<uint32_t>(c.model().head_dim(), 1u << 20));
  if (c.codec().has_key_levels()) q.key_levels = static_cast<int>(std::min(c.codec().key_levels(), 1000u));
  if (c.codec().has_value_levels()) q.value_levels = static_cast<int>(std::min(c.codec().value_levels(), 1000u));
  if (c.codec().has_key_bytes()) q.key_bytes = static_cast<int>(std::min(c.codec().key_bytes(), 1u << 30));
  if (c.codec().has_value_bytes()) q.value_bytes = static_cast<int>(std::min(c.codec().value_bytes(), 1u << 30));
  if (c.codec().has_alpha()) q.alpha = c.codec().alpha();
  if (!c.codec().value_refit().empty()) {
    absl::StatusOr<Refit> r = ParseRefit(c.codec().value_refit());
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("codec.value_refit: ", r.status().message()));
    q.value_refit = *r;
  }
  if (c.codec().has_page_tokens()) q.mean_window = static_cast<int>(std::min(c.codec().page_tokens(), 1u << 30));
  if (absl::Status st = q.Validate(); !st.ok()) {
    // DQuantConfig names its own fields; say where they live in the config.
    return absl::InvalidArgumentError(absl::StrCat("model/codec: ", st.message()));
  }
  if (absl::Status st = ResolveTransform(c, &o); !st.ok()) return st;
  if (c.has_window_tokens()) {
    if (c.window_tokens() > 1u << 20) {
      return absl::InvalidArgumentError(
          absl::StrCat("window_tokens ", c.window_tokens(), " out of range [0, 1048576]"));
    }
    o.window_tokens = static_cast<int>(c.window_tokens());
  }
  if (c.has_max_sequences()) {
    if (c.max_sequences() < 1) return absl::InvalidArgumentError("max_sequences 0 must be >= 1");
    o.max_sequences = c.max_sequences();
  }
  if (c.has_ttl_seconds()) {
    if (!(c.ttl_seconds() >= 0.0) || !std::isfinite(c.ttl_seconds())) {
      return absl::InvalidArgumentError(absl::StrCat("ttl_seconds ", c.ttl_seconds(), " must be finite and >= 0"));
    }
    o.ttl_seconds = c.ttl_seconds();
  }
  if (c.has_max_message_bytes()) {
    if (c.max_message_bytes() < 4096 || c.max_message_bytes() > (1ull << 31) - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_message_bytes ", c.max_message_bytes(), " out of range [4096, 2147483647]"));
    }
    o.max_message_bytes = c.max_message_bytes();
  }
  if (c.attend_poll_threads() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("attend_poll_threads ", c.attend_poll_threads(), " out of range [0, 64]"));
  }
  o.attend_poll_threads = static_cast<int>(c.attend_poll_threads());
  if (c.has_attend_poll_spin_us()) {
    if (c.attend_poll_spin_us() > 1000000) {
      return absl::InvalidArgumentError(
          absl::StrCat("attend_poll_spin_us ", c.attend_poll_spin_us(), " out of range [0, 1000000]"));
    }
    o.attend_poll_spin_us = static_cast<int>(c.attend_poll_spin_us());
  }
  if (c.has_grpc_read_chunk_bytes() && c.grpc_read_chunk_bytes() != 0) {
    if (c.grpc_read_chunk_bytes() < 4096 || c.grpc_read_chunk_bytes() > (64u << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("grpc_read_chunk_bytes ", c.grpc_read_chunk_bytes(),
                                                     " out of range [4096, 67108864] (or 0: gRPC's default)"));
    }
    o.grpc_read_chunk_bytes = c.grpc_read_chunk_bytes();
  }
  if (c.has_max_batch()) {
    if (c.max_batch() < 1 || c.max_batch() > 1u << 20) {
      return absl::InvalidArgumentError(absl::StrCat("max_batch ", c.max_batch(), " out of range [1, 1048576]"));
    }
    o.max_batch = static_cast<int>(c.max_batch());
  }
  if (c.has_read_chunk_tokens()) {
    if (c.read_chunk_tokens() < 1 || c.read_chunk_tokens() > 1u << 20) {
      return absl::InvalidArgumentError(
          absl::StrCat("read_chunk_tokens ", c.read_chunk_tokens(), " out of range [1, 1048576]"));
    }
    o.read_chunk_tokens = static_cast<int>(c.read_chunk_tokens());
  }
  if (c.has_backend_threads()) {
    if (c.backend_threads() > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend_threads ", c.backend_threads(), " out of range [0, 1024]"));
    }
    o.backend_threads = static_cast<int>(c.backend_threads());
  }
  if (c.has_attend_batching()) {
    o.attend_batching = c.attend_batching();
  }
  if (c.pool_bytes() == 0) {
    return absl::InvalidArgumentError("pool_bytes 0: the pool capacity must be set");
  }
  o.pool_bytes = c.pool_bytes();
  if (c.has_hot_tier_bytes() && c.has_hot_tier_fraction()) {
    return absl::InvalidArgumentError(absl::StrCat("hot_tier_bytes ", c.hot_tier_bytes(), " and hot_tier_fraction ",
                                                   c.hot_tier_fraction(), " are both set; set one"));
  }
  o.hot_tier_bytes = c.hot_tier_bytes();
  o.hot_tier_fraction = c.hot_tier_fraction();
  if (c.has_hot_idle_seconds()) o.hot_idle_seconds = c.hot_idle_seconds();
  if (c.has_hot_keep_cold_copies()) o.hot_keep_cold_copies = c.hot_keep_cold_copies();
  if (c.hot_promotion() == "async") {
    o.hot_promotion = HotPromotion::kAsync;
  } else if (!c.hot_promotion().empty() && c.hot_promotion() != "sync") {
    return absl::InvalidArgumentError(
        absl::StrCat("hot_promotion \"", c.hot_promotion(), "\" unknown; use sync or async"));
  }
  if (absl::Status st = ValidateHotTier(o); !st.ok()) return st;
  if (c.has_nccl_max_channels()) {
    if (c.nccl_max_channels() > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl_max_channels ", c.nccl_max_channels(), " out of range [0, 1024]"));
    }
    o.nccl_max_channels = static_cast<int>(c.nccl_max_channels());
  }
  if (c.has_nccl_chunk_timeout_seconds()) {
    const double t = c.nccl_chunk_timeout_seconds();
    if (!(t > 0.0) || !std::isfinite(t)) {
      return absl::InvalidArgumentError(absl::StrCat("nccl_chunk_timeout_seconds ", t, " must be finite and > 0"));
    }
    o.nccl_chunk_timeout_seconds = t;
  }
  if (c.has_nccl_idle_seconds()) {
    const double t = c.nccl_idle_seconds();
    if (!(t > 0.0) || !std::isfinite(t)) {
      return absl::InvalidArgumentError(absl::StrCat("nccl_idle_seconds ", t, " must be finite and > 0"));
    }
    o.nccl_idle_seconds = t;
  }
  for (int i = 0; i < c.devices_size(); ++i) {
    if (c.devices(i) > 1023) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "] ", c.devices(i), " out of range [0, 1023]"));
    }
    if (std::find(o.devices.begin(), o.devices.end(), static_cast<int>(c.devices(i))) != o.devices.end()) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "] ", c.devices(i), " is listed twice"));
    }
    o.devices.push_back(static_cast<int>(c.devices(i)));
  }
  if (c.has_nccl_max_chunk_bytes()) {
    if (c.nccl_max_chunk_bytes() < 2 || c.nccl_max_chunk_bytes() > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl_max_chunk_bytes ", c.nccl_max_chunk_bytes(), " out of range [2, 2^40]"));
    }
    o.nccl_max_chunk_bytes = c.nccl_max_chunk_bytes();
  }
  if (absl::Status st = ResolveSecurity(c, &o); !st.ok()) return st;
  o.snapshot_dir = c.snapshot_dir();
  for (const auto& [field, has, value, out] : {std::make_tuple("drain_timeout_seconds", c.has_drain_timeout_seconds(),
                                                               c.drain_timeout_seconds(), &o.drain_timeout_seconds),
                                               std::make_tuple("drain_notice_seconds", c.has_drain_notice_seconds(),
                                                               c.drain_notice_seconds(), &o.drain_notice_seconds)}) {
    if (!has) continue;
    if (!(value >= 0.0) || !(value <= kMaxDrainSeconds)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", value, " out of range [0, ", kMaxDrainSeconds, "]"));
    }
    *out = value;
  }
  if (c.has_verify_pages_on_attend()) o.verify_pages_on_attend = c.verify_pages_on_attend();
  if (absl::Status st = ResolveRegions(c, &o); !st.ok()) return st;
  if (absl::Status st = ResolveLevels(c, &o); !st.ok()) return st;
  return o;
}

absl::Status ValidateLevels(const ServiceOptions& o) {
  if (o.host_level.on()) {
    if (o.host_level.budget_bytes < kMinHostLevelBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("host_level.budget_bytes ", o.host_level.budget_bytes, " must be >= ", kMinHostLevelBytes));
    }
  }
  const DiskLevelOptions& d = o.disk_level;
  if (!d.on()) return absl::OkStatus();
  if (d.budget_bytes < kMinDiskLevelBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk_level.budget_bytes ", d.budget_bytes, " must be >= ", kMinDiskLevelBytes));
  }
  if (d.segment_bytes < kMinDiskSegmentBytes || d.segment_bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk_level.segment_bytes ", d.segment_bytes, " out of range [", kMinDiskSegmentBytes, ", 2^40]"));
  }
  return absl::OkStatus();
}

}  // namespace driftkv
