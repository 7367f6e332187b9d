// Shared prefix namespaces (config prefix_namespaces; docs/prefix_cache.md,
// "Shared prefix namespaces"), CPU backend: tenants of one namespace find
// and fork each other's indexed pages, bit for bit, each charged for what
// it holds; a tenant outside it sees nothing, in the words of a prompt
// never stored; the config names every bad value.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/page_key.h"
#include "tests/handler_fixture.h"
#include "tests/prefix_test_util.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SyntheticKv;
using testing::SyntheticQuery;
using testing::TestHandler;

constexpr int kN = testing::kSmallN, kD = 64, kQHeads = 4, kLayers = 2;

const char kShared[] = "prefix_namespaces { name: \"team\" tenants: \"alice\" tenants: \"bob\" }\n";

// Tokens [first, ids.size()) of `kv` to every layer, with their ids.
absl::Status PushWithIds(Handler& h, const std::string& tenant, const std::string& seq, const Kv& kv,
                         const std::vector<uint32_t>& ids, int first = 0) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    v1::AppendChunk c = testing::ChunkOf(seq, l, first, static_cast<uint32_t>(ids.size() - first), kv);
    for (size_t i = first; i < ids.size(); ++i) c.add_token_ids(ids[i]);
    v1::AppendResponse r;
    if (absl::Status st = h.Append(c, &r, tenant); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ForkResponse> ForkPrefix(Handler& h, const std::string& tenant, const std::vector<uint32_t>& ids,
                                            const std::string& id) {
  v1::ForkRequest req;
  for (uint32_t t : ids) req.add_prefix_token_ids(t);
  req.set_sequence_id(id);
  v1::ForkResponse resp;
  absl::Status st = h.Fork(req, &resp, tenant);
  if (!st.ok()) return st;
  return resp;
}

// Every token of `seq` read back, then each layer's Attend output and lse
// for a fixed query.
std::string Answers(Handler& h, const std::string& tenant, const std::string& seq) {
  std::string all;
  for (uint32_t l = 0; l < kLayers; ++l) {
    v1::ReadRequest rr;
    rr.set_sequence_id(seq);
    rr.set_layer(l);
    absl::Status st = h.Read(
        rr,
        [&](const v1::ReadChunk& c) {
          all += c.keys();
          all += c.values();
          return true;
        },
        tenant);
    EXPECT_TRUE(st.ok()) << st;
    v1::AttendRequest req;
    *req.add_items() = testing::QueryItem(seq, l, SyntheticQuery(kQHeads, kD, 11 + l), kQHeads);
    v1::AttendResponse resp;
    st = h.Attend(req, &resp, tenant);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) continue;
    const v1::AttendResult& r = resp.results(0);
    all += r.output();
    all.append(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * 4);
  }
  return all;
}

v1::StatsResponse StatsOf(Handler& h, const std::string& tenant) {
  v1::StatsResponse s;
  h.Stats(&s, tenant);
  return s;
}

TEST(PrefixNamespace, TenantsOfOneNamespaceShareAndOthersSeeNothing) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("ns-share", kShared, {"alice", "bob", "carol"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  const Kv kv = SyntheticKv(200, kN, 5);
  // 200 tokens with a window of 32: 5 sealed pages of 32 per layer.
  const std::vector<uint32_t> ids = testing::PromptIds(200, 5);
  ASSERT_TRUE(PushWithIds(*t.h, "alice", "a", kv, ids).ok());
  const uint64_t pool_pages = t.Stats().pages_in_use();

  // Bob finds alice's pages and forks them without a copy.
  v1::LookupResponse r = testing::LookupIds(*t.h, ids, "bob");
  EXPECT_EQ(r.pages(), 5u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_NEVER_STORED);  // page 5 is in the window
  absl::StatusOr<v1::ForkResponse> f = ForkPrefix(*t.h, "bob", ids, "b");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tokens(), 160u);
  EXPECT_EQ(t.Stats().pages_in_use(), pool_pages) << "the fork copied pages";
  // Bob holds the pages too and is charged for them, as for a fork of his own.
  EXPECT_EQ(StatsOf(*t.h, "bob").tenant_pages(), 5u * kLayers);
  // Appended the rest, bob's fork answers as alice's sequence, bit for bit.
  ASSERT_TRUE(PushWithIds(*t.h, "bob", "b", kv, ids, 160).ok());
  const std::string alices = Answers(*t.h, "alice", "a");
  EXPECT_TRUE(Answers(*t.h, "bob", "b") == alices);

  // Alice's release leaves bob's fork whole.
  v1::ReleaseRequest rel;
  rel.set_sequence_id("a");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(t.h->Release(rel, &rr, "alice").ok());
  EXPECT_TRUE(Answers(*t.h, "bob", "b") == alices);

  // Carol is outside: nothing, in the words of a prompt never stored.
  r = testing::LookupIds(*t.h, ids, "carol");
  EXPECT_EQ(r.pages(), 0u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_NEVER_STORED);
  EXPECT_EQ(r.miss_message(),
            "page 0 (tokens [0, 32)) of layer 0 was never stored with token_ids by this tenant under this codec");
  EXPECT_EQ(ForkPrefix(*t.h, "carol", ids, "c").status().code(), absl::StatusCode::kNotFound);
  // A miss inside the namespace names it.
  r = testing::LookupIds(*t.h, testing::PromptIds(64, 99), "alice");
  EXPECT_EQ(r.miss_message(),
            "page 0 (tokens [0, 32)) of layer 0 was never stored with token_ids by the tenants of prefix "
            "namespace \"team\" under this codec");
  // A sequence id stays the tenant's own: bob cannot fork alice's by id.
  ASSERT_TRUE(PushWithIds(*t.h, "alice", "a2", kv, ids).ok());
  v1::ForkRequest by_id;
  by_id.set_sequence_id("b2");
  by_id.set_source_sequence_id("a2");
  by_id.set_tokens(32);
  v1::ForkResponse fr;
  const absl::Status by_id_status = t.h->Fork(by_id, &fr, "bob");
  EXPECT_EQ(by_id_status.code(), absl::StatusCode::kNotFound) << by_id_status;
}

TEST(PrefixNamespace, CarolsOwnPagesStayHers) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("ns-own", kShared, {"alice", "bob", "carol"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  const Kv kv = SyntheticKv(100, kN, 6);
  const std::vector<uint32_t> ids = testing::PromptIds(100, 6);
  ASSERT_TRUE(PushWithIds(*t.h, "carol", "c", kv, ids).ok());
  EXPECT_EQ(testing::LookupIds(*t.h, ids, "carol").pages(), 2u);
  EXPECT_EQ(testing::LookupIds(*t.h, ids, "alice").pages(), 0u);
  EXPECT_EQ(testing::LookupIds(*t.h, ids, "bob").pages(), 0u);
  // The namespaces' keys: a tenant's own and a shared one never coincide,
  // even for a namespace named as a tenant.
  EXPECT_NE(NamespaceKey("codec", "team").Hex(), SharedNamespaceKey("codec", "team").Hex());
}

TEST(PrefixNamespace, ConfigNamesEveryBadValue) {
  struct Case {
    std::string config, message;
  };
  const std::vector<Case> cases = {
      {"prefix_namespaces { name: \"t\" tenants: \"alice\" tenants: \"zed\" }",
       "prefix_namespaces \"t\": tenant \"zed\" is not a tenant of tokens_file"},
      {"prefix_namespaces { name: \"t\" tenants: \"alice\" }",
       "prefix_namespaces \"t\" lists 1 tenants; a shared namespace needs at least 2"},
      {"prefix_namespaces { name: \"t\" tenants: \"alice\" tenants: \"bob\" }"
       "prefix_namespaces { name: \"u\" tenants: \"bob\" tenants: \"carol\" }",
       "prefix_namespaces \"u\": tenant \"bob\" is already in prefix namespace \"t\""},
      {"prefix_namespaces { name: \"t\" tenants: \"alice\" tenants: \"bob\" }"
       "prefix_namespaces { name: \"t\" tenants: \"carol\" tenants: \"dave\" }",
       "prefix_namespaces \"t\" is named twice"},
      {"prefix_namespaces { name: \"a b\" tenants: \"alice\" tenants: \"bob\" }",
       "prefix_namespaces \"a b\": the name must be 1 to 64 bytes of [A-Za-z0-9._-]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ServiceOptions> o = testing::TenantOptions("ns-bad", c.config, {"alice", "bob", "carol", "dave"});
    ASSERT_FALSE(o.ok()) << c.config;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(c.message), std::string::npos) << o.status() << "\nwanted: " << c.message;
  }
  // Without tokens there is one tenant: nothing to share with.
  v1::ServerConfig plain;
  plain.mutable_model()->set_layers(2);
  plain.mutable_model()->set_kv_heads(2);
  plain.mutable_model()->set_head_dim(64);
  plain.set_pool_bytes(8 << 20);
  v1::PrefixNamespace* ns = plain.add_prefix_namespaces();
  ns->set_name("t");
  ns->add_tenants("alice");
  ns->add_tenants("bob");
  absl::StatusOr<ServiceOptions> o = ResolveConfig(plain);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "prefix_namespaces \"t\" needs tokens_file: without tokens every call is the same tenant");
}

}  // namespace
}  // namespace driftkv
