// Handler::Fork through the handler, CPU backend (docs/prefix_cache.md):
// a fork appended the rest of its tokens equals a sequence given all of
// them (Read bytes, Attend output and lse bit for bit), in the cold and the
// hot tier; the source's release keeps the fork, both releases empty both
// pools; a tier move of one side leaves the other as it was; eight threads
// forking, appending, attending and releasing at once; every refusal with
// its exact words and nothing changed; the tenant's charge; a warm restart
// of hot forks.
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;
using testing::TestHandler;
using C = absl::StatusCode;

constexpr int kN = testing::kSmallN, kD = 64, kQHeads = 4, kLayers = 2;

// The hot tier needs pages of 128 tokens (level pages); R = 128 too.
constexpr int kHotP = 128, kHotR = 128;

ServiceOptions HotOptions(int hot_pages) {
  ServiceOptions o = SmallOptions(4u << 20);
  o.codec.mean_window = kHotP;
  o.window_tokens = kHotR;
  o.hot_tier_bytes = hot_pages * MakeLevelPageLayout(2, kD)->page_bytes;
  return o;
}

ServiceOptions ColdTwinOfHot() {
  ServiceOptions o = HotOptions(1);
  o.hot_tier_bytes = 0;
  return o;
}

absl::StatusOr<v1::ForkResponse> Fork(Handler& h, const std::string& source, const std::string& id, uint64_t tokens,
                                      const std::string& tenant = "", bool new_incarnation = false) {
  v1::ForkRequest req;
  req.set_source_sequence_id(source);
  req.set_sequence_id(id);
  req.set_tokens(tokens);
  req.set_new_incarnation(new_incarnation);
  v1::ForkResponse resp;
  absl::Status st = h.Fork(req, &resp, tenant);
  if (!st.ok()) return st;
  return resp;
}

absl::Status Release(Handler& h, const std::string& id, const std::string& tenant = "") {
  v1::ReleaseRequest req;
  req.set_sequence_id(id);
  v1::ReleaseResponse resp;
  return h.Release(req, &resp, tenant);
}

// One layer's Attend answer (output, then lse) as bytes, query of `seed`;
// a failure's status as text.
std::string AttendBytes(Handler& h, const std::string& seq, uint32_t layer, uint32_t seed = 7) {
  v1::AttendRequest req;
  *req.add_items() = testing::QueryItem(seq, layer, SyntheticQuery(kQHeads, kD, seed + layer), kQHeads);
  v1::AttendResponse resp;
  absl::Status st = h.Attend(req, &resp);
  if (!st.ok()) return st.ToString();
  const v1::AttendResult& r = resp.results(0);
  return absl::StrCat(r.output(), std::string(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * 4));
}

std::string LengthText(Handler& h, const std::string& seq) {
  v1::LengthRequest req;
  req.set_sequence_id(seq);
  v1::LengthResponse resp;
  absl::Status st = h.Length(req, &resp);
  return st.ok() ? resp.ShortDebugString() : st.ToString();
}

// Everything a client can see of a sequence without changing it: each
// layer's length and tokens as Read returns them.
std::string Stored(Handler& h, const std::string& seq) {
  std::string all = LengthText(h, seq);
  for (uint32_t l = 0; l < kLayers; ++l) all += testing::ReadLayerBytes(h, seq, l);
  return all;
}

// Stored, and each layer's Attend answer (which promotes in a hot tier).
std::string Answers(Handler& h, const std::string& seq) {
  std::string all = Stored(h, seq);
  for (uint32_t l = 0; l < kLayers; ++l) all += AttendBytes(h, seq, l);
  return all;
}

// Tokens [0, at) of `a`, then those of `b`: a continuation that differs
// from the source's after the shared prefix.
Kv Spliced(const Kv& a, const Kv& b, int at) {
  Kv out = b;
  std::copy(a.keys.begin(), a.keys.begin() + static_cast<size_t>(at) * kN, out.keys.begin());
  std::copy(a.values.begin(), a.values.begin() + static_cast<size_t>(at) * kN, out.values.begin());
  return out;
}

absl::Status PushAll(TestHandler& t, const std::string& seq, const Kv& kv, int first, int count, int chunk = 97) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (absl::Status st = t.Push(seq, l, kv, first, count, chunk); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// The pages of layer `layer` of `seq` and whether they are hot.
std::pair<std::vector<PageId>, bool> PagesOf(Handler& h, const std::string& seq, uint32_t layer) {
  std::pair<std::vector<PageId>, bool> out;
  h.WithLayerForTest(seq, layer, [&](LayerState& l) { out = {l.pages, l.hot}; });
  return out;
}

// Each page's reference count in its pool.
std::vector<int32_t> References(Handler& h, const std::pair<std::vector<PageId>, bool>& pages) {
  const PagePool& pool = pages.second ? *h.hot_pool() : h.pool();
  std::vector<int32_t> refs;
  for (PageId p : pages.first) refs.push_back(pool.references(p));
  return refs;
}

// Sequences, pages, tokens and the tenant's holdings, as one line.
std::string Accounts(TestHandler& t) {
  const v1::StatsResponse s = t.Stats();
  return absl::StrCat("sequences ", s.sequences(), ", pages ", s.pages_in_use(), ", hot pages ", s.hot_pages_in_use(),
                      ", hot layers ", s.hot_layers(), ", compressed ", s.tokens_compressed(), ", window ",
                      s.tokens_window(), ", tenant pages ", s.tenant_pages(), ", tenant bytes ", s.tenant_bytes());
}

TEST(Fork, AppendingTheRestEqualsAFreshSequence) {
  TestHandler t(SmallOptions());  // P = R = 32
  const Kv kv = SyntheticKv(460, kN, 1), other = SyntheticKv(460, kN, 2);
  ASSERT_TRUE(PushAll(t, "src", kv, 0, 300).ok());  // 8 pages (256 tokens) per layer
  const std::string source = Answers(*t.h, "src");
  for (int tokens : {32, 128, 256}) {
    const std::string fork = absl::StrCat("f", tokens), whole = absl::StrCat("w", tokens);
    const uint64_t pages = t.Stats().pages_in_use();
    absl::StatusOr<v1::ForkResponse> r = Fork(*t.h, "src", fork, tokens);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->pages_shared(), static_cast<uint64_t>(tokens / 32 * kLayers));
    ASSERT_EQ(r->layers_size(), kLayers);
    EXPECT_EQ(r->layers(1).ShortDebugString(), absl::StrCat("tokens: ", tokens, " compressed_tokens: ", tokens));
    EXPECT_EQ(t.Stats().pages_in_use(), pages) << "a fork shares, it does not copy";
    // The fork's own continuation, in other chunks on each layer.
    const Kv want = Spliced(kv, other, tokens);
    ASSERT_TRUE(t.Push(fork, 0, want, tokens, 460 - tokens, 1 + tokens % 7).ok());
    ASSERT_TRUE(t.Push(fork, 1, want, tokens, 460 - tokens, 300).ok());
    ASSERT_TRUE(PushAll(t, whole, want, 0, 460).ok());
    EXPECT_EQ(Answers(*t.h, fork), Answers(*t.h, whole)) << tokens;
    EXPECT_EQ(Answers(*t.h, "src"), source);
  }
}

TEST(Fork, AppendingTheRestEqualsAFreshSequenceInTheHotTier) {
  TestHandler hot(HotOptions(64)), cold(ColdTwinOfHot());
  const Kv kv = SyntheticKv(1000, kN, 3), other = SyntheticKv(1000, kN, 4);
  for (TestHandler* t : {&hot, &cold}) ASSERT_TRUE(PushAll(*t, "src", kv, 0, 700).ok());  // 4 pages per layer
  const std::string source = Answers(*cold.h, "src");
  EXPECT_EQ(Answers(*hot.h, "src"), source);  // attended: hot now
  ASSERT_TRUE(hot.h->LayerIsHot("src", 0) && hot.h->LayerIsHot("src", 1));
  ASSERT_TRUE(Fork(*hot.h, "src", "f", 384).ok());
  EXPECT_TRUE(hot.h->LayerIsHot("f", 0) && hot.h->LayerIsHot("f", 1));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), 8u);
  EXPECT_EQ(hot.Stats().hot_layers(), 4u);
  // The rest: the new pages go hot (3 per layer), as in any hot layer.
  const Kv want = Spliced(kv, other, 384);
  ASSERT_TRUE(PushAll(hot, "f", want, 384, 616, 200).ok());
  EXPECT_TRUE(hot.h->LayerIsHot("f", 0) && hot.h->LayerIsHot("f", 1));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), 14u);
  ASSERT_TRUE(PushAll(cold, "whole", want, 0, 1000).ok());
  ASSERT_TRUE(PushAll(hot, "whole", want, 0, 1000).ok());
  const std::string expected = Answers(*cold.h, "whole");
  EXPECT_EQ(Answers(*hot.h, "f"), expected);
  EXPECT_EQ(Answers(*hot.h, "whole"), expected);
  EXPECT_EQ(Answers(*hot.h, "src"), source);
}

// In both tiers: the fork outlives its source unchanged, the source its
// fork, and releasing both gives back every page of both pools and every
// charge.
TEST(Fork, ReleasingEitherSideKeepsTheOtherAndBothEmptyThePools) {
  for (bool hot_tier : {false, true}) {
    SCOPED_TRACE(hot_tier ? "hot" : "cold");
    TestHandler t(hot_tier ? HotOptions(64) : ColdTwinOfHot());
    const std::string empty = Accounts(t);
    const Kv kv = SyntheticKv(900, kN, 5);
    // The source first.
    ASSERT_TRUE(PushAll(t, "a", kv, 0, 700).ok());
    if (hot_tier) Answers(*t.h, "a");  // promotes both layers
    ASSERT_TRUE(Fork(*t.h, "a", "a-fork", 256).ok());
    ASSERT_TRUE(t.Push("a-fork", 0, kv, 256, 300).ok());  // pages of its own on layer 0
    const std::string fork = Answers(*t.h, "a-fork");
    ASSERT_TRUE(Release(*t.h, "a").ok());
    EXPECT_EQ(Answers(*t.h, "a-fork"), fork);
    ASSERT_TRUE(Release(*t.h, "a-fork").ok());
    EXPECT_EQ(Accounts(t), empty);
    // The fork first.
    ASSERT_TRUE(PushAll(t, "b", kv, 0, 700).ok());
    if (hot_tier) Answers(*t.h, "b");
    const std::string source = Answers(*t.h, "b");
    ASSERT_TRUE(Fork(*t.h, "b", "b-fork", 512).ok());
    const auto layer1 = PagesOf(*t.h, "b", 1);
    EXPECT_EQ(layer1.second, hot_tier);
    EXPECT_EQ(References(*t.h, layer1), std::vector<int32_t>({2, 2, 2, 2}));
    ASSERT_TRUE(Release(*t.h, "b-fork").ok());
    EXPECT_EQ(References(*t.h, layer1), std::vector<int32_t>({1, 1, 1, 1}));
    EXPECT_EQ(Answers(*t.h, "b"), source);
    ASSERT_TRUE(Release(*t.h, "b").ok());
    EXPECT_EQ(Accounts(t), empty);
  }
}

// Promotion and demotion reserve new pages for the layer that moves and
// free its old ones: only its own references go, the other side keeps its
// pages in its tier.
TEST(Fork, MovingOneSideBetweenTiersLeavesTheOtherIntact) {
  // Cold copies off: they would keep a promoted layer's cold references
  // (as copies; counted in service_hot_tier_test and cold_copies_test).
  ServiceOptions o = HotOptions(64);
  o.hot_keep_cold_copies = false;
  TestHandler t(o);
  const Kv kv = SyntheticKv(700, kN, 6);
  ASSERT_TRUE(PushAll(t, "src", kv, 0, 700).ok());  // 4 pages per layer, cold
  const std::string src = Stored(*t.h, "src");
  // A cold fork promoted: the source's cold pages lose its references.
  ASSERT_TRUE(Fork(*t.h, "src", "cold-fork", 512).ok());
  const std::string cold_fork = Stored(*t.h, "cold-fork");
  const auto src0 = PagesOf(*t.h, "src", 0);
  EXPECT_EQ(References(*t.h, src0), std::vector<int32_t>({2, 2, 2, 2}));
  const std::string cold_fork_answer = AttendBytes(*t.h, "cold-fork", 0);
  EXPECT_TRUE(t.h->LayerIsHot("cold-fork", 0));
  EXPECT_FALSE(t.h->LayerIsHot("src", 0));
  EXPECT_EQ(References(*t.h, src0), std::vector<int32_t>({1, 1, 1, 1}));
  EXPECT_EQ(Stored(*t.h, "src"), src);
  EXPECT_EQ(Stored(*t.h, "cold-fork"), cold_fork);
  // The source promoted, then a fork of its hot layer 0 and cold layer 1.
  const std::string src_answer = AttendBytes(*t.h, "src", 0);
  ASSERT_TRUE(Fork(*t.h, "src", "mixed", 384).ok());
  EXPECT_TRUE(t.h->LayerIsHot("mixed", 0));
  EXPECT_FALSE(t.h->LayerIsHot("mixed", 1));
  const std::string mixed = Stored(*t.h, "mixed");
  const auto mixed0 = PagesOf(*t.h, "mixed", 0);
  EXPECT_EQ(References(*t.h, mixed0), std::vector<int32_t>({2, 2, 2}));
  const std::string mixed_answer = AttendBytes(*t.h, "mixed", 0);
  // The source's hot layer demoted for idling while the forks' stay
  // attended: "mixed" keeps the hot pages, alone.
  t.Advance(61);
  AttendBytes(*t.h, "mixed", 0);
  AttendBytes(*t.h, "cold-fork", 0);
  t.h->ExpireIdle();
  EXPECT_FALSE(t.h->LayerIsHot("src", 0));
  EXPECT_TRUE(t.h->LayerIsHot("mixed", 0));
  EXPECT_EQ(PagesOf(*t.h, "mixed", 0), mixed0);
  EXPECT_EQ(References(*t.h, mixed0), std::vector<int32_t>({1, 1, 1}));
  // Layer 1 of the source is shared by both forks (4 and 3 pages); the
  // promotion of "mixed"'s takes only its references away.
  const auto src1 = PagesOf(*t.h, "src", 1);
  EXPECT_EQ(References(*t.h, src1), std::vector<int32_t>({3, 3, 3, 2}));
  AttendBytes(*t.h, "mixed", 1);
  EXPECT_TRUE(t.h->LayerIsHot("mixed", 1));
  EXPECT_EQ(References(*t.h, src1), std::vector<int32_t>({2, 2, 2, 2}));
  EXPECT_EQ(Stored(*t.h, "src"), src);
  EXPECT_EQ(Stored(*t.h, "mixed"), mixed);
  EXPECT_EQ(Stored(*t.h, "cold-fork"), cold_fork);
  EXPECT_EQ(AttendBytes(*t.h, "src", 0), src_answer);
  EXPECT_EQ(AttendBytes(*t.h, "mixed", 0), mixed_answer);
  EXPECT_EQ(AttendBytes(*t.h, "cold-fork", 0), cold_fork_answer);
  for (const char* id : {"src", "mixed", "cold-fork"}) ASSERT_TRUE(Release(*t.h, id).ok());
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  EXPECT_EQ(t.Stats().hot_pages_in_use(), 0u);
}

// Eight threads fork one source, each appends its own continuation,
// attends (a hot budget too small for all: promotions demote others) and
// reads every live fork back as a fresh sequence of its tokens would be,
// then releases it. At the end the source's pages have one reference each
// and the pools hold only its pages.
TEST(Fork, ConcurrentForksAppendsAttendsAndReleases) {
  constexpr int kThreads = 8, kRounds = 3, kShared = 384, kTokens = 800;
  TestHandler t(HotOptions(20), testing::FixtureClock::kReal), reference(ColdTwinOfHot());
  const Kv kv = SyntheticKv(kTokens, kN, 7);
  ASSERT_TRUE(PushAll(t, "src", kv, 0, 700).ok());
  Answers(*t.h, "src");  // hot to begin with
  std::vector<Kv> want;
  std::vector<std::string> expected;
  for (int i = 0; i < kThreads; ++i) {
    want.push_back(Spliced(kv, SyntheticKv(kTokens, kN, 100 + i), kShared));
    const std::string id = absl::StrCat("w", i);
    ASSERT_TRUE(PushAll(reference, id, want[i], 0, kTokens).ok());
    expected.push_back(Answers(*reference.h, id));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        const std::string id = absl::StrCat("f", i, "-", round);
        absl::StatusOr<v1::ForkResponse> r = Fork(*t.h, "src", id, kShared);
        absl::Status st = r.status();
        if (st.ok()) st = PushAll(t, id, want[i], kShared, kTokens - kShared, 61);
        // What the client sees, compared in the reference's form: Length
        // and Read hold no sequence name.
        const std::string got = st.ok() ? Answers(*t.h, id) : st.ToString();
        if (got != expected[i]) ++failures;
        if (!Release(*t.h, id).ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const auto pages = PagesOf(*t.h, "src", l);
    EXPECT_EQ(References(*t.h, pages), std::vector<int32_t>(4, 1)) << "layer " << l;
  }
  const v1::StatsResponse s = t.Stats();
  EXPECT_EQ(s.sequences(), 1u);
  EXPECT_EQ(s.pages_in_use() + s.hot_pages_in_use(), 8u);
  ASSERT_TRUE(Release(*t.h, "src").ok());
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  EXPECT_EQ(t.Stats().hot_pages_in_use(), 0u);
}

// What a refused Fork must leave as it was: the accounts, and each
// sequence's tokens and page references.
std::string Everything(TestHandler& t, const std::vector<std::string>& ids, const std::string& tenant = "") {
  std::string all = Accounts(t);
  for (const std::string& id : ids) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      v1::ReadRequest req;
      req.set_sequence_id(id);
      req.set_layer(l);
      absl::StrAppend(&all, "\n", id, " layer ", l, ":");
      absl::Status st = t.h->Read(
          req,
          [&](const v1::ReadChunk& c) {
            absl::StrAppend(&all, c.keys(), c.values());
            return true;
          },
          tenant);
      absl::StrAppend(&all, st.ToString(), " references");
      for (int32_t r : References(*t.h, PagesOf(*t.h, TenantKey(tenant, id), l))) absl::StrAppend(&all, " ", r);
    }
  }
  return all;
}

// The status an Append of one token to the new sequence `id` gets.
absl::Status AppendNew(Handler& h, const std::string& id, const std::string& tenant = "") {
  const Kv kv = SyntheticKv(1, kN, 9);
  v1::AppendResponse r;
  return h.Append(testing::ChunkOf(id, 0, 0, 1, kv), &r, tenant);
}

// src: 300 tokens on layer 0 (256 in pages), 100 on layer 1 (64).
absl::Status PushSource(TestHandler& t, const std::string& tenant = "") {
  const Kv kv = SyntheticKv(300, kN, 8);
  v1::AppendResponse r;
  for (uint32_t l = 0; l < kLayers; ++l) {
    absl::Status st = t.h->Append(testing::ChunkOf("src", l, 0, l == 0 ? 300 : 100, kv), &r, tenant);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

TEST(Fork, RefusalsNameTheFieldAndChangeNothing) {
  ServiceOptions o = SmallOptions();
  o.tombstone_seconds = 600;
  TestHandler t(o);
  ASSERT_TRUE(PushSource(t).ok());
  ASSERT_TRUE(AppendNew(*t.h, "taken").ok());
  ASSERT_TRUE(AppendNew(*t.h, "gone").ok());
  ASSERT_TRUE(Release(*t.h, "gone").ok());
  const absl::Status tombstoned = AppendNew(*t.h, "gone");
  ASSERT_EQ(tombstoned.code(), C::kFailedPrecondition) << tombstoned;
  const std::string before = Everything(t, {"src", "taken"});
  struct Case {
    std::string source, id;
    uint64_t tokens;
    absl::Status want;
  };
  const Case cases[] = {
      {"nope", "x", 32, absl::NotFoundError("source_sequence_id \"nope\" not found")},
      {"src", "taken", 32,
       absl::AlreadyExistsError("sequence_id \"taken\" already exists; fork into a new id, or release it first")},
      {"src", "gone", 32, tombstoned},
      {"src", "x", 0,
       absl::InvalidArgumentError(
           "tokens 0 is not a positive multiple of page_tokens 32; a fork shares whole pages (append the rest to it)")},
      {"src", "x", 48,
       absl::InvalidArgumentError("tokens 48 is not a positive multiple of page_tokens 32; a fork shares whole pages "
                                  "(append the rest to it)")},
      {"src", "x", 96,
       absl::InvalidArgumentError("tokens 96 exceeds the 64 paged tokens of layer 1 of source_sequence_id \"src\"; "
                                  "only tokens in full pages are shared (the bf16 window's are not)")},
      {"src", "x", uint64_t{1} << 62,
       absl::InvalidArgumentError("tokens 4611686018427387904 exceeds the 256 paged tokens of layer 0 of "
                                  "source_sequence_id \"src\"; only tokens in full pages are shared (the bf16 "
                                  "window's are not)")},
      {"src", "src", 32,
       absl::InvalidArgumentError("sequence_id \"src\" is also the source_sequence_id; a fork needs a new id")},
      {"", "x", 32, absl::InvalidArgumentError("source_sequence_id has 0 bytes; it must have 1 to 256")},
      {"src", "a\nb", 32, AppendNew(*t.h, "a\nb")},
  };
  for (const Case& c : cases) {
    absl::StatusOr<v1::ForkResponse> r = Fork(*t.h, c.source, c.id, c.tokens);
    EXPECT_EQ(r.status(), c.want);
    EXPECT_EQ(Everything(t, {"src", "taken"}), before) << c.want;
  }
  // The tombstoned id with new_incarnation, as an Append may.
  EXPECT_TRUE(Fork(*t.h, "src", "gone", 32, "", /*new_incarnation=*/true).ok());
}

TEST(Fork, AnotherTenantsSourceIsNotFound) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("fork", "", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  ASSERT_TRUE(PushSource(t, "alice").ok());
  const std::string before = Everything(t, {"src"}, "alice");
  EXPECT_EQ(Fork(*t.h, "src", "x", 32, "bob").status(), absl::NotFoundError("source_sequence_id \"src\" not found"));
  EXPECT_EQ(Everything(t, {"src"}, "alice"), before);
  EXPECT_TRUE(Fork(*t.h, "src", "x", 32, "alice").ok());
}

// Creation limits: refused as an Append creating the same id is, with
// nothing charged or shared.
TEST(Fork, LimitsRefuseItAsTheyRefuseANewSequence) {
  int64_t stride = 0, held = 0;
  {
    TestHandler probe(SmallOptions());
    ASSERT_TRUE(PushSource(probe).ok());
    stride = static_cast<int64_t>(probe.h->pool().page_stride());
    held = static_cast<int64_t>(probe.Stats().tenant_bytes());
  }
  for (int limit = 0; limit < 5; ++limit) {
    SCOPED_TRACE(limit);
    ServiceOptions o = SmallOptions();
    switch (limit) {
      case 0: o.max_sequences = 1; break;
      case 1: o.tenant_defaults.max_sequences = 1; break;
      case 2: o.tenant_defaults.max_pages = 13; break;                     // src holds 10; the fork needs 4 more
      case 3: o.tenant_defaults.max_bytes = held + 4 * stride - 1; break;  // 1 byte short
      default: break;                                                      // 4: draining
    }
    TestHandler t(o);
    ASSERT_TRUE(PushSource(t).ok());
    if (limit == 4) t.h->BeginDrain();
    const std::string before = Everything(t, {"src"});
    const absl::Status st = Fork(*t.h, "src", "x", 64).status();
    EXPECT_EQ(Everything(t, {"src"}), before);
    if (limit == 2 || limit == 3) {
      const std::string needs =
          limit == 2 ? std::string("quota max_pages 13: it holds 10 pages and this call needs 4 more")
                     : absl::StrCat("this call needs ", 4 * stride, " more (cold pages +", 4 * stride, ")");
      EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
      EXPECT_NE(st.message().find(needs), absl::string_view::npos) << st;
    } else {
      EXPECT_FALSE(st.ok());
      EXPECT_EQ(st, AppendNew(*t.h, "x"));
    }
  }
}

// The tenant pays for a fork's pages as for its own, at their tier's page
// size, and gets it back at its release; the pool counts them once.
TEST(Fork, TheTenantIsChargedForTheForksPagesAtTheirTier) {
  TestHandler t(HotOptions(64));
  const Kv kv = SyntheticKv(700, kN, 10);
  ASSERT_TRUE(PushAll(t, "src", kv, 0, 700).ok());
  AttendBytes(*t.h, "src", 0);  // layer 0 hot, layer 1 cold
  const v1::StatsResponse before = t.Stats();
  ASSERT_TRUE(Fork(*t.h, "src", "f", 256).ok());
  const v1::StatsResponse after = t.Stats();
  const uint64_t cold = t.h->pool().page_stride(), hot = t.h->hot_pool()->page_stride();
  EXPECT_EQ(after.tenant_bytes(), before.tenant_bytes() + 2 * hot + 2 * cold);
  EXPECT_EQ(after.tenant_pages(), before.tenant_pages() + 4);
  EXPECT_EQ(after.tenant_sequences(), before.tenant_sequences() + 1);
  EXPECT_EQ(after.tokens_compressed(), before.tokens_compressed() + 512);
  EXPECT_EQ(after.pages_in_use(), before.pages_in_use());
  EXPECT_EQ(after.hot_pages_in_use(), before.hot_pages_in_use());
  ASSERT_TRUE(Release(*t.h, "f").ok());
  const v1::StatsResponse released = t.Stats();
  EXPECT_EQ(released.tenant_bytes(), before.tenant_bytes());
  EXPECT_EQ(released.tenant_pages(), before.tenant_pages());
  EXPECT_EQ(released.tokens_compressed(), before.tokens_compressed());
}

// A snapshot writes each sequence's pages (hot ones in their cold form),
// a page whose bytes the file already holds for the tenant as a reference:
// after a warm restart every sequence answers as before, and the pages the
// forks shared are held once (demotion at drain gave each holder of a
// shared hot page an equal cold one).
TEST(Fork, HotForksRestoreBitIdenticallyAfterAWarmRestart) {
  const std::string dir = ::testing::TempDir() + "/fork-hot-snapshot";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<std::string> ids = {"src", "f1", "f2", "f1-fork"};
  std::vector<std::string> answers;
  Handler::SnapshotSummary written;
  {
    TestHandler t(HotOptions(64));
    const Kv kv = SyntheticKv(900, kN, 11), other = SyntheticKv(900, kN, 12);
    ASSERT_TRUE(PushAll(t, "src", kv, 0, 700).ok());
    Answers(*t.h, "src");
    ASSERT_TRUE(Fork(*t.h, "src", "f1", 384).ok());
    ASSERT_TRUE(PushAll(t, "f1", Spliced(kv, other, 384), 384, 516).ok());  // 6 pages per layer
    ASSERT_TRUE(Fork(*t.h, "src", "f2", 512).ok());
    ASSERT_TRUE(Fork(*t.h, "f1", "f1-fork", 640).ok());
    for (const std::string& id : ids) answers.push_back(Answers(*t.h, id));
    ASSERT_TRUE(t.h->WriteSnapshot(dir, &written).ok());
    EXPECT_EQ(written.sequences, 4u);
    EXPECT_EQ(written.pages, (4 + 6 + 4 + 5) * 2u);
  }
  TestHandler t(HotOptions(64));
  Handler::SnapshotSummary loaded;
  ASSERT_TRUE(t.h->LoadSnapshot(dir, &loaded).ok());
  EXPECT_EQ(loaded.sequences, 4u);
  EXPECT_EQ(loaded.dropped_sequences, 0u);
  EXPECT_EQ(loaded.shared_pages, written.shared_pages);
  // src's 4 pages and f1's own 3 (its other 3 are src's; f2's and
  // f1-fork's are all shared), per layer; every layer holds the same data
  // here, so the second layer's pages repeat the first's.
  EXPECT_EQ(written.pages - written.shared_pages, 4u + 3u);
  EXPECT_EQ(t.Stats().pages_in_use(), 4u + 3u);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(Answers(*t.h, ids[i]), answers[i]) << ids[i];
  for (const std::string& id : ids) ASSERT_TRUE(Release(*t.h, id).ok());
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
}

}  // namespace
}  // namespace driftkv
