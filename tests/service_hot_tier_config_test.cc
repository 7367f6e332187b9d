// The hot tier's configuration (docs/hot_tier.md, "Service"; docs/api.md):
// every error of the config and of the handler's start names its field and
// value; the budgets' defaults and split; the CUDA backend's
// device_cold_scratch_bytes.
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "service/config.h"
#include "service/handler.h"
#include "tests/hot_tier_test_server.h"

namespace driftkv {
namespace {

using namespace hot_tier_test;  // NOLINT(build/namespaces)

// Config: every error names its field and value.
TEST(HotTierConfig, Errors) {
  auto resolve = [](const std::string& extra) {
    v1::ServerConfig c;
    c.mutable_model()->set_layers(2);
    c.mutable_model()->set_kv_heads(2);
    c.mutable_model()->set_head_dim(64);
    c.set_pool_bytes(1 << 22);
    google::protobuf::TextFormat::MergeFromString(extra, &c);
    return ResolveConfig(c);
  };
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"hot_tier_bytes: 1000000 hot_tier_fraction: 0.2", "hot_tier_bytes 1000000 and hot_tier_fraction 0.2"},
      {"hot_tier_fraction: 1.0", "hot_tier_fraction 1 out of range"},
      {"hot_tier_fraction: -0.5", "hot_tier_fraction -0.5 out of range"},
      {"hot_idle_seconds: -1", "hot_idle_seconds -1"},
      {"hot_promotion: \"lazy\"", "hot_promotion \"lazy\" unknown"},
  };
  for (const Case& k : cases) {
    absl::StatusOr<ServiceOptions> o = resolve(k.text);
    ASSERT_FALSE(o.ok()) << k.text;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(o.status().message(), k.message)) << o.status();
  }
  absl::StatusOr<ServiceOptions> ok =
      resolve("hot_tier_fraction: 0.25 hot_idle_seconds: 5 hot_promotion: \"async\" hot_keep_cold_copies: false");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->hot_keep_cold_copies);
  EXPECT_EQ(ok->hot_promotion, HotPromotion::kAsync);
  EXPECT_EQ(ok->hot_idle_seconds, 5.0);
  EXPECT_EQ(ok->hot_budget_bytes(), 1u << 20);
  EXPECT_EQ(ok->cold_pool_bytes(), 3u << 20);
  absl::StatusOr<ServiceOptions> defaults = resolve("");
  ASSERT_TRUE(defaults.ok());
  EXPECT_FALSE(defaults->hot_tier());
  EXPECT_EQ(defaults->hot_idle_seconds, 60.0);
  EXPECT_EQ(defaults->hot_promotion, HotPromotion::kSync);
  EXPECT_TRUE(defaults->hot_keep_cold_copies);
}

TEST(HotTierConfig, StartupErrors) {
  auto create = [](const ServiceOptions& o) {
    Metrics m;
    return Handler::Create(o, &m).status();
  };
  // The codec has no level page: pages of 32 tokens, more than 6 value levels.
  ServiceOptions o = HotOptions(4);
  o.codec.mean_window = 32;
  absl::Status st = create(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "hot_tier_bytes")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "mean_window")) << st;
  o = HotOptions(4);
  o.codec.value_levels = 8;
  st = create(o);
  EXPECT_TRUE(absl::StrContains(st.message(), "value_levels")) << st;
  // Less than one level page.
  o = HotOptions(4);
  o.hot_tier_bytes = 1000;
  st = create(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "hot_tier_bytes 1000")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "less than one level page")) << st;
  // A fraction that leaves no cold page.
  o = HotOptions(0);
  o.hot_tier_bytes = 0;
  o.pool_bytes = 20000;
  o.hot_tier_fraction = 0.9;
  st = create(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "hot_tier_fraction 0.9")) << st;
  // Both budgets (ServiceOptions built by hand).
  o = HotOptions(4);
  o.hot_tier_fraction = 0.5;
  st = create(o);
  EXPECT_TRUE(absl::StrContains(st.message(), "both set")) << st;
  // A backend without a hot tier.
  RegisterBackend("nohot", [](const BackendArgs& a) -> absl::StatusOr<std::unique_ptr<Backend>> {
    absl::StatusOr<const DQuantCodec*> codec = ServedDQuant("nohot", a);
    if (!codec.ok()) return codec.status();
    return MakeCpuBackend(*codec, a.pool, a.threads);
  });
  o = HotOptions(4);
  o.backend = "nohot";
  st = create(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "backend \"nohot\" has no hot tier")) << st;
  // The fraction splits pool_bytes.
  o = HotOptions(0);
  o.hot_tier_bytes = 0;
  o.hot_tier_fraction = 0.5;
  Metrics m;
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, &m);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)->pool().capacity_pages(), static_cast<int64_t>((2u << 20) / (*h)->pool().page_stride()));
  EXPECT_EQ((*h)->hot_pool()->capacity_pages(), static_cast<int64_t>((2u << 20) / LevelPageBytes()));
}

// device_cold_scratch_bytes (the CUDA backend's level pages for cold
// launches): absent is the backend's default, 0 turns it off, and an
// absurd size is refused by name.
TEST(HotTier, ColdScratchConfig) {
  auto resolve = [](const std::string& text) {
    v1::ServerConfig config;
    config.mutable_model()->set_layers(2);
    config.mutable_model()->set_kv_heads(2);
    config.mutable_model()->set_head_dim(64);
    config.set_pool_bytes(8 << 20);
    EXPECT_TRUE(google::protobuf::TextFormat::MergeFromString(text, &config)) << text;
    return ResolveConfig(config);
  };
  absl::StatusOr<ServiceOptions> o = resolve("");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device_cold_scratch_bytes, -1);
  o = resolve("device_cold_scratch_bytes: 0");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device_cold_scratch_bytes, 0);
  o = resolve("device_cold_scratch_bytes: 268435456");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device_cold_scratch_bytes, 268435456);
  o = resolve("device_cold_scratch_bytes: 2199023255552");
  EXPECT_EQ(o.status(), absl::InvalidArgumentError("device_cold_scratch_bytes 2199023255552 exceeds 1 TiB"));
}

}  // namespace
}  // namespace driftkv
