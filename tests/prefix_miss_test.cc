// Why a Lookup missed, and the counters that say so (docs/prefix_cache.md,
// "Why a miss was a miss"): a prompt that diverges inside a page after a
// stored prefix is MISS_DIVERGED; another tenant's pages read to the caller
// as never stored but count as outcome="other_namespace" in the server's
// metrics; whole hits, evictions and never-stored prompts; the page
// counters add up to the prompts' pages, per tenant too.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/prefix_test_util.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::TestHandler;

constexpr int kN = testing::kSmallN, kLayers = 2;

std::vector<uint32_t> Ids(int count, uint32_t seed) {
  std::vector<uint32_t> ids(count);
  for (int i = 0; i < count; ++i) ids[i] = (seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 50000u;
  return ids;
}

void Push(Handler& h, const std::string& seq, const std::vector<uint32_t>& ids, const std::string& tenant = "") {
  const Kv kv = SyntheticKv(static_cast<int>(ids.size()), kN, 3);
  v1::AppendResponse r;
  for (uint32_t l = 0; l < kLayers; ++l) {
    v1::AppendChunk c = testing::ChunkOf(seq, l, 0, static_cast<int>(ids.size()), kv);
    for (uint32_t id : ids) c.add_token_ids(id);
    ASSERT_TRUE(h.Append(c, &r, tenant).ok());
  }
}

// The value of counter `name` with labels `labels` (all of them), 0 if absent.
double Counter(const Metrics& m, const std::string& name, const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : m.registry()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      std::map<std::string, std::string> have;
      for (const prometheus::ClientMetric::Label& l : c.label) have[l.name] = l.value;
      if (have == labels) return c.counter.value;
    }
  }
  return 0;
}

double Lookups(const Metrics& m, const std::string& outcome) {
  return Counter(m, "driftkv_prefix_lookups_total", {{"outcome", outcome}});
}
double Pages(const Metrics& m, const std::string& outcome) {
  return Counter(m, "driftkv_prefix_lookup_pages_total", {{"outcome", outcome}});
}

TEST(PrefixMiss, ADivergingPromptIsDivergedAndCountedSo) {
  TestHandler t(SmallOptions());
  const std::vector<uint32_t> stored = Ids(300, 1);  // 8 pages per layer
  Push(*t.h, "a", stored);
  // The same 70 tokens (pages 0 and 1, and 6 of page 2), then others.
  std::vector<uint32_t> prompt = stored;
  prompt.resize(256);
  for (int i = 70; i < 256; ++i) prompt[i] += 1;
  v1::LookupResponse r = testing::LookupIds(*t.h, prompt);
  EXPECT_EQ(r.pages(), 2u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_DIVERGED);
  EXPECT_EQ(r.miss_message(),
            "page 2 (tokens [64, 96)) of layer 0 is not held, but another page following the same prefix was "
            "stored: the prompt diverges from a stored one inside this page (other token ids, or hashed otherwise)");
  EXPECT_EQ(Lookups(t.metrics, "diverged"), 1.0);
  EXPECT_EQ(Pages(t.metrics, "hit"), 2.0);
  EXPECT_EQ(Pages(t.metrics, "diverged"), 6.0);
  // A whole hit; a prompt of which nothing was stored (a first page is
  // never said to diverge: every prompt's first page follows the root).
  EXPECT_EQ(testing::LookupIds(*t.h, std::vector<uint32_t>(stored.begin(), stored.begin() + 256)).miss_reason(),
            v1::MISS_NONE);
  EXPECT_EQ(testing::LookupIds(*t.h, Ids(64, 9)).miss_reason(), v1::MISS_NEVER_STORED);
  EXPECT_EQ(Lookups(t.metrics, "hit"), 1.0);
  EXPECT_EQ(Lookups(t.metrics, "never_stored"), 1.0);
  EXPECT_EQ(Pages(t.metrics, "hit"), 10.0);
  EXPECT_EQ(Pages(t.metrics, "never_stored"), 2.0);
  // Evicted: the index's pages go once the sequence is released.
  v1::ReleaseRequest rel;
  rel.set_sequence_id("a");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(t.h->Release(rel, &rr).ok());
  t.h->prefix_index().EvictAll();
  EXPECT_EQ(testing::LookupIds(*t.h, stored).miss_reason(), v1::MISS_EVICTED);
  EXPECT_EQ(Lookups(t.metrics, "evicted"), 1.0);
  EXPECT_EQ(Pages(t.metrics, "evicted"), 9.0);  // 300 ids: 9 full pages
}

// Bob's Lookup of alice's prompt: never stored to bob, in the same words
// as a prompt nobody stored; the server's metrics say other_namespace,
// per tenant too (metrics_per_tenant).
TEST(PrefixMiss, AnotherTenantsPagesAreNeverStoredToTheCallerOnly) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("prefix-miss", "", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  Metrics metrics(/*per_tenant=*/true);
  absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(*o, &metrics);
  ASSERT_TRUE(made.ok()) << made.status();
  Handler& h = **made;
  const std::vector<uint32_t> ids = Ids(200, 4);
  Push(h, "a", ids, "alice");
  v1::LookupResponse theirs = testing::LookupIds(h, ids, "bob");
  v1::LookupResponse nobodys = testing::LookupIds(h, Ids(200, 5), "bob");
  EXPECT_EQ(theirs.miss_reason(), v1::MISS_NEVER_STORED);
  EXPECT_EQ(theirs.SerializeAsString(), nobodys.SerializeAsString());
  EXPECT_EQ(Lookups(metrics, "other_namespace"), 1.0);
  EXPECT_EQ(Lookups(metrics, "never_stored"), 1.0);
  EXPECT_EQ(testing::LookupIds(h, ids, "alice").pages(), 5u);  // 200 tokens, a window of 32
  EXPECT_EQ(
      Counter(metrics, "driftkv_tenant_prefix_lookups_total", {{"tenant", "bob"}, {"outcome", "other_namespace"}}),
      1.0);
  EXPECT_EQ(Counter(metrics, "driftkv_tenant_prefix_lookup_pages_total", {{"tenant", "alice"}, {"outcome", "hit"}}),
            5.0);
  EXPECT_EQ(Counter(metrics, "driftkv_tenant_prefix_lookup_pages_total", {{"tenant", "bob"}, {"outcome", "hit"}}), 0.0);
  // Without per_tenant no series names a tenant.
  TestHandler plain(SmallOptions());
  testing::LookupIds(*plain.h, ids);
  for (const prometheus::MetricFamily& f : plain.metrics.registry()->Collect()) {
    EXPECT_EQ(f.name.find("driftkv_tenant_"), std::string::npos) << f.name;
  }
}

}  // namespace
}  // namespace driftkv
