#include "service/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

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

}  // namespace

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
  // handler starts (service/backend.h).
  if (c.model().layers() < 1 || c.model().layers() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.layers ", c.model().layers(), " out of range [1, ", kMaxLayers, "]"));
  }
  o.layers = static_cast<int>(c.model().layers());
  if (!c.codec().name().empty() && c.codec().name() != "dquant") {
    return absl::InvalidArgumentError(
        absl::StrCat("codec.name \"", c.codec().name(), "\" is not served (only \"dquant\")"));
  }
  DQuantConfig& q = o.codec;
  q.kv_heads = static_cast<int>(std::min<uint32_t>(c.model().kv_heads(), 1u << 20));
  q.head_dim = static_cast<int>(std::min<uint32_t>(c.model().head_dim(), 1u << 20));
  if (c.codec().has_key_levels()) q.key_levels = static_cast<int>(std::min(c.codec().key_levels(), 1000u));
  if (c.codec().has_value_levels()) q.value_levels = static_cast<int>(std::min(c.codec().value_levels(), 1000u));
  if (c.codec().has_key_bytes()) q.key_bytes = static_cast<int>(std::min(c.codec().key_bytes(), 1u << 30));
  if (c.codec().has_value_bytes()) q.value_bytes = static_cast<int>(std::min(c.codec().value_bytes(), 1u << 30));
  if (c.codec().has_alpha()) q.alpha = c.codec().alpha();
  if (c.codec().has_page_tokens()) q.mean_window = static_cast<int>(std::min(c.codec().page_tokens(), 1u << 30));
  if (absl::Status st = q.Validate(); !st.ok()) {
    // DQuantConfig names its own fields; say where they live in the config.
    return absl::InvalidArgumentError(absl::StrCat("model/codec: ", st.message()));
  }
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
      return absl::InvalidArgumentError(
          absl::StrCat("ttl_seconds ", c.ttl_seconds(), " must be finite and >= 0"));
    }
    o.ttl_seconds = c.ttl_seconds();
  }
  if (c.has_max_message_bytes()) {
    if (c.max_message_bytes() < 4096 || c.max_message_bytes() > (1ull << 31) - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_message_bytes ", c.max_message_bytes(), " out of range [4096, 2147483647]"));
    }
    o.max_message_bytes = c.max_message_bytes();
  }
  if (c.has_max_batch()) {
    if (c.max_batch() < 1 || c.max_batch() > 1u << 20) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_batch ", c.max_batch(), " out of range [1, 1048576]"));
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
  if (c.pool_bytes() == 0) {
    return absl::InvalidArgumentError("pool_bytes 0: the pool capacity must be set");
  }
  o.pool_bytes = c.pool_bytes();
  return o;
}

}  // namespace driftkv
