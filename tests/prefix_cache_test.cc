// The prefix cache through the handler, CPU backend (docs/prefix_cache.md):
// page keys against vectors computed independently (Python's hashlib, the
// same vectors as python/tests/test_prefix.py); pages sealed with token ids
// indexed and kept after their sequence's release; Lookup per layer and
// overall with its miss reasons; Fork from a prefix appended the rest equals
// a sequence given everything (Read bytes, Attend output and lse, bit for
// bit), cold and hot; contradicting ids refused; eviction under pressure
// never takes a page a live sequence holds and counts return to zero;
// refusals with their words, changing nothing; threads at once.
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/page_key.h"
#include "tests/handler_fixture.h"
#include "tests/prefix_test_util.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;
using testing::TestHandler;
using C = absl::StatusCode;

constexpr int kN = testing::kSmallN, kD = 64, kQHeads = 4, kLayers = 2, kP = 32;

std::string Hex(const PageKey& k) {
  return k.Hex();
}

// Tokens [first, first + count) of `kv` to one layer, in chunks of `chunk`,
// each with its token ids (none when `ids` is null).
absl::Status PushIds(Handler& h, const std::string& seq, uint32_t layer, const Kv& kv, const std::vector<uint32_t>* ids,
                     int first, int count, int chunk = 97, const std::string& tenant = "") {
  v1::AppendResponse r;
  for (int t = first; t < first + count; t += chunk) {
    const int n = std::min(chunk, first + count - t);
    v1::AppendChunk c = testing::ChunkOf(seq, layer, t, n, kv);
    if (ids != nullptr) {
      for (int i = t; i < t + n; ++i) c.add_token_ids((*ids)[i]);
    }
    if (absl::Status st = h.Append(c, &r, tenant); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status PushAllIds(Handler& h, const std::string& seq, const Kv& kv, const std::vector<uint32_t>* ids, int first,
                        int count, int chunk = 97, const std::string& tenant = "") {
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (absl::Status st = PushIds(h, seq, l, kv, ids, first, count, chunk, tenant); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ForkResponse> ForkPrefix(Handler& h, const std::vector<uint32_t>& ids, const std::string& id,
                                            uint64_t tokens = 0, const std::string& tenant = "") {
  v1::ForkRequest req;
  for (uint32_t t : ids) req.add_prefix_token_ids(t);
  req.set_sequence_id(id);
  req.set_tokens(tokens);
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

std::string AttendBytes(Handler& h, const std::string& seq, uint32_t layer) {
  v1::AttendRequest req;
  *req.add_items() = testing::QueryItem(seq, layer, SyntheticQuery(kQHeads, kD, 7 + layer), kQHeads);
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

std::string Stored(Handler& h, const std::string& seq) {
  std::string all = LengthText(h, seq);
  for (uint32_t l = 0; l < kLayers; ++l) all += testing::ReadLayerBytes(h, seq, l);
  return all;
}

std::string Answers(Handler& h, const std::string& seq) {
  std::string all = Stored(h, seq);
  for (uint32_t l = 0; l < kLayers; ++l) all += AttendBytes(h, seq, l);
  return all;
}

ServiceOptions HotOptions(int hot_pages) {
  ServiceOptions o = SmallOptions(4u << 20);
  o.codec.mean_window = 128;
  o.window_tokens = 128;
  o.hot_tier_bytes = hot_pages * MakeLevelPageLayout(2, kD)->page_bytes;
  return o;
}

TEST(PageKeys, MatchVectorsComputedIndependently) {
  // hashlib.sha256(b"driftkv page key v1").digest()[:16], and the chain
  // of docs/prefix_cache.md over little-endian uint32 ids.
  EXPECT_EQ(Hex(PageKeyRoot()), "1174970676183745ff488e59518b4982");
  std::vector<PageKey> keys;
  ChainPageKeys(std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}, 4, &keys);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(Hex(keys[0]), "12562a842dad2df419d7e5d3f9aea541");
  EXPECT_EQ(Hex(keys[1]), "c6d880be1218d3fdc0e607ec7b4ca61e");
  std::vector<uint32_t> ids(64);
  for (int i = 0; i < 64; ++i) ids[i] = 1000 + i;
  keys.clear();
  ChainPageKeys(ids, 32, &keys);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(Hex(keys[0]), "9d4411a3d285023a38a99a8bec8c18b7");
  EXPECT_EQ(Hex(keys[1]), "cc4bedde7a7229c901f61622055642b5");
  keys.clear();
  ChainPageKeys(std::vector<uint32_t>{0xffffffffu, 0, 0x12345678u, 7}, 4, &keys);
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(Hex(keys[0]), "4ec57aeac09b693a10b772753f8b026d");
  // Namespaces differ by tenant and by codec.
  EXPECT_NE(NamespaceKey("codec a", "t"), NamespaceKey("codec b", "t"));
  EXPECT_NE(NamespaceKey("codec a", "t"), NamespaceKey("codec a", "u"));
}

TEST(PrefixCache, ReleasedPagesStayIndexedAndLookupFindsThemPerLayer) {
  TestHandler t(SmallOptions());  // P = R = 32
  const Kv kv = SyntheticKv(460, kN, 1);
  const std::vector<uint32_t> ids = testing::PromptIds(460, 1);
  // Layer 0 gets 300 tokens (8 pages), layer 1 only 200 (5 pages).
  ASSERT_TRUE(PushIds(*t.h, "src", 0, kv, &ids, 0, 300).ok());
  ASSERT_TRUE(PushIds(*t.h, "src", 1, kv, &ids, 0, 200).ok());
  EXPECT_EQ(t.h->prefix_index().entries(), 13);
  const uint64_t pages = t.Stats().pages_in_use();
  v1::LookupResponse r = testing::LookupIds(*t.h, ids);
  EXPECT_EQ(r.prompt_pages(), 14u);
  EXPECT_EQ(r.pages(), 5u);
  EXPECT_EQ(r.tokens(), 160u);
  ASSERT_EQ(r.layer_pages_size(), 2);
  EXPECT_EQ(r.layer_pages(0), 8u);
  EXPECT_EQ(r.layer_pages(1), 5u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_NEVER_STORED);
  EXPECT_EQ(r.miss_page(), 5u);
  EXPECT_EQ(r.miss_layer(), 1u);
  EXPECT_EQ(r.miss_message(),
            "page 5 (tokens [160, 192)) of layer 1 was never stored with token_ids by this tenant under this codec");
  // Released, the pages stay as cache: the pool keeps them.
  ASSERT_TRUE(Release(*t.h, "src").ok());
  EXPECT_EQ(t.Stats().pages_in_use(), pages);
  EXPECT_EQ(testing::LookupIds(*t.h, ids).ShortDebugString(), r.ShortDebugString());
  // By page keys: the same answer; a prompt of other ids: nothing.
  v1::LookupRequest by_keys;
  std::vector<PageKey> keys;
  ChainPageKeys(ids, kP, &keys);
  for (const PageKey& k : keys) by_keys.add_page_keys(std::string(k.view()));
  v1::LookupResponse r2;
  ASSERT_TRUE(t.h->Lookup(by_keys, &r2).ok());
  EXPECT_EQ(r2.ShortDebugString(), r.ShortDebugString());
  std::vector<uint32_t> other = ids;
  other[5] += 1;
  r = testing::LookupIds(*t.h, other);
  EXPECT_EQ(r.pages(), 0u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_NEVER_STORED);
  // A prompt shorter than a page has no page to look up.
  r = testing::LookupIds(*t.h, std::vector<uint32_t>(ids.begin(), ids.begin() + 31));
  EXPECT_EQ(r.ShortDebugString(), "layer_pages: 0 layer_pages: 0");
  // Every reference goes once nothing holds the pages.
  EXPECT_EQ(t.h->prefix_index().EvictAll(), 13);
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  r = testing::LookupIds(*t.h, ids);
  EXPECT_EQ(r.miss_reason(), v1::MISS_EVICTED);
  EXPECT_EQ(r.miss_message(), "page 0 (tokens [0, 32)) of layer 0 was evicted to make room");
}

// A fork from the index appended the rest equals a sequence given all
// tokens, whether the source is live or released; the fork shares the
// indexed pages (no new page) and answers the tokens it took.
TEST(PrefixCache, ForkFromAPrefixAppendedTheRestEqualsAFreshSequence) {
  TestHandler t(SmallOptions());
  const Kv kv = SyntheticKv(460, kN, 3), other = SyntheticKv(460, kN, 4);
  const std::vector<uint32_t> ids = testing::PromptIds(460, 3);
  ASSERT_TRUE(PushAllIds(*t.h, "src", kv, &ids, 0, 300).ok());  // 8 pages per layer
  ASSERT_TRUE(Release(*t.h, "src").ok());
  for (uint64_t bound : {0, 128, 640}) {
    SCOPED_TRACE(bound);
    const std::string fork = absl::StrCat("f", bound), whole = absl::StrCat("w", bound);
    const uint64_t pages = t.Stats().pages_in_use();
    absl::StatusOr<v1::ForkResponse> r = ForkPrefix(*t.h, ids, fork, bound);
    ASSERT_TRUE(r.ok()) << r.status();
    // The first fork finds src's 8 pages; the last also those of the
    // first fork and whole sequence (13 pages, as far as the ids go).
    const uint64_t tokens = bound == 0 ? 256 : bound == 128 ? 128 : 416;
    EXPECT_EQ(r->tokens(), tokens);
    EXPECT_EQ(r->pages_shared(), tokens / kP * kLayers);
    EXPECT_EQ(r->layers(1).ShortDebugString(), absl::StrCat("tokens: ", tokens, " compressed_tokens: ", tokens));
    EXPECT_EQ(t.Stats().pages_in_use(), pages) << "shared, not copied";
    // The same prompt's tokens after the prefix, then a continuation of
    // other tokens: as a fresh sequence given them whole.
    Kv want = kv;
    std::copy(other.keys.begin() + 400 * kN, other.keys.end(), want.keys.begin() + 400 * kN);
    std::copy(other.values.begin() + 400 * kN, other.values.end(), want.values.begin() + 400 * kN);
    ASSERT_TRUE(PushIds(*t.h, fork, 0, want, &ids, tokens, 460 - tokens, 1 + tokens % 7).ok());
    ASSERT_TRUE(PushIds(*t.h, fork, 1, want, &ids, tokens, 460 - tokens, 300).ok());
    ASSERT_TRUE(PushAllIds(*t.h, whole, want, &ids, 0, 460).ok());
    EXPECT_EQ(Answers(*t.h, fork), Answers(*t.h, whole));
  }
}

// In a hot tier: the index holds the cold pages of hot layers; a fork from
// it is cold, goes hot when attended, and answers as a fresh sequence of a
// handler without a hot tier does.
TEST(PrefixCache, ForkFromAPrefixEqualsAFreshSequenceInTheHotTier) {
  ServiceOptions cold_options = HotOptions(1);
  cold_options.hot_tier_bytes = 0;
  TestHandler hot(HotOptions(64)), cold(cold_options);
  const Kv kv = SyntheticKv(1000, kN, 5);
  const std::vector<uint32_t> ids = testing::PromptIds(1000, 5);
  ASSERT_TRUE(PushAllIds(*hot.h, "src", kv, &ids, 0, 700).ok());  // 4 pages of 128 per layer
  (void)Answers(*hot.h, "src");                                   // attended: hot now
  ASSERT_TRUE(hot.h->LayerIsHot("src", 0));
  // Pages sealed while hot are indexed in their cold form.
  ASSERT_TRUE(PushAllIds(*hot.h, "src", kv, &ids, 700, 200).ok());
  EXPECT_EQ(hot.h->prefix_index().entries(), 2 * 6);
  // Those cold pages are also the layers' copies, beside the promoted ones
  // (all shared with the index: none counts as held by copies alone), so
  // the idle demotion codes nothing.
  EXPECT_EQ(hot.Stats().cold_copy_pages(), 0u);
  hot.Advance(61);
  hot.h->ExpireIdle();
  ASSERT_FALSE(hot.h->LayerIsHot("src", 0));
  EXPECT_EQ(hot.Stats().pages_demoted_from_copies(), 2u * 6);
  EXPECT_EQ(hot.Stats().pages_in_use(), 12u);
  ASSERT_TRUE(Release(*hot.h, "src").ok());
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), 0u);
  EXPECT_EQ(hot.Stats().pages_in_use(), 12u);
  absl::StatusOr<v1::ForkResponse> r = ForkPrefix(*hot.h, ids, "f");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens(), 768u);
  EXPECT_FALSE(hot.h->LayerIsHot("f", 0));
  ASSERT_TRUE(PushAllIds(*hot.h, "f", kv, &ids, 768, 232, 100).ok());
  ASSERT_TRUE(PushAllIds(*cold.h, "whole", kv, &ids, 0, 1000).ok());
  const std::string expected = Answers(*cold.h, "whole");
  EXPECT_EQ(Answers(*hot.h, "f"), expected);
  EXPECT_TRUE(hot.h->LayerIsHot("f", 0) && hot.h->LayerIsHot("f", 1));
  EXPECT_EQ(Answers(*hot.h, "f"), expected);
  ASSERT_TRUE(Release(*hot.h, "f").ok());
  hot.h->prefix_index().EvictAll();
  EXPECT_EQ(hot.Stats().pages_in_use(), 0u);
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), 0u);
}

TEST(PrefixCache, ContradictingIdsAreRefusedNamingTheRangeAndStoreNothing) {
  TestHandler t(SmallOptions());
  const Kv kv = SyntheticKv(200, kN, 6);
  const std::vector<uint32_t> ids = testing::PromptIds(200, 6);
  ASSERT_TRUE(PushIds(*t.h, "s", 0, kv, &ids, 0, 100, 100).ok());
  std::vector<uint32_t> wrong = ids;
  wrong[40] += 1;
  const std::string before = Stored(*t.h, "s");
  const v1::StatsResponse stats = t.Stats();
  absl::Status st = PushIds(*t.h, "s", 1, kv, &wrong, 0, 64, 64);
  EXPECT_EQ(st, absl::AlreadyExistsError(absl::StrCat(
                    "token_ids of tokens [0, 64) of layer 1 contradict the ids sequence_id \"s\" holds for them: "
                    "token 40 holds id ",
                    ids[40], ", the chunk says ", wrong[40], "; nothing stored")));
  // A repeat of stored tokens with other ids is refused too.
  st = PushIds(*t.h, "s", 0, kv, &wrong, 32, 20, 20);
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "token_ids of tokens [32, 52) of layer 0")) << st;
  EXPECT_EQ(Stored(*t.h, "s"), before);
  EXPECT_EQ(t.Stats().pages_in_use(), stats.pages_in_use());
  // The right ids are taken, and a count that is not one per token is not.
  EXPECT_TRUE(PushIds(*t.h, "s", 1, kv, &ids, 0, 64, 64).ok());
  v1::AppendChunk c = testing::ChunkOf("s", 1, 64, 10, kv);
  c.add_token_ids(1);
  v1::AppendResponse resp;
  EXPECT_EQ(t.h->Append(c, &resp),
            absl::InvalidArgumentError("token_ids has 1 ids; token_count 10 needs one per token (or none)"));
}

TEST(PrefixCache, MissReasonsTellUnhashedEvictedAndAnotherTenant) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("prefix", "", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  const Kv kv = SyntheticKv(300, kN, 7);
  const std::vector<uint32_t> ids = testing::PromptIds(300, 7);
  // Ids for 100 tokens, then 200 without: pages 0-2 are keyed.
  ASSERT_TRUE(PushAllIds(*t.h, "u", kv, &ids, 0, 100, 100, "alice").ok());
  ASSERT_TRUE(PushAllIds(*t.h, "u", kv, nullptr, 100, 200, 100, "alice").ok());
  v1::LookupResponse r = testing::LookupIds(*t.h, ids, "alice");
  EXPECT_EQ(r.pages(), 3u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_UNHASHED);
  EXPECT_EQ(r.miss_message(),
            "page 3 (tokens [96, 128)) of layer 0 is not indexed: a sequence holding the pages before it went on "
            "with tokens appended without token_ids");
  // A sequence without any ids says nothing of a prompt's first page.
  ASSERT_TRUE(PushAllIds(*t.h, "n", kv, nullptr, 0, 100, 100, "alice").ok());
  EXPECT_EQ(testing::LookupIds(*t.h, testing::PromptIds(64, 99), "alice").miss_reason(), v1::MISS_NEVER_STORED);
  // Bob sees nothing of alice's, in the words of a prompt never stored.
  r = testing::LookupIds(*t.h, ids, "bob");
  EXPECT_EQ(r.pages(), 0u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_NEVER_STORED);
  absl::StatusOr<v1::ForkResponse> f = ForkPrefix(*t.h, ids, "x", 0, "bob");
  EXPECT_EQ(f.status(),
            absl::NotFoundError("no stored prefix of the prompt for sequence_id \"x\": page 0 (tokens [0, 32)) of "
                                "layer 0 was never stored with token_ids by this tenant under this codec"));
  EXPECT_TRUE(ForkPrefix(*t.h, ids, "x", 0, "alice").ok());
}

// A pool of 40 pages: cached pages go for an Append that needs room, least
// recent first, never one a live sequence (or a fork) holds; every live
// sequence reads back bit for bit; an Append is refused only when nothing
// can go; everything returns to zero.
TEST(PrefixCache, EvictionUnderPressureKeepsEveryLivePage) {
  size_t stride = 0;
  {
    TestHandler probe(SmallOptions());
    stride = probe.h->pool().page_stride();
  }
  TestHandler t(SmallOptions(40 * stride));
  ASSERT_EQ(t.h->pool().capacity_pages(), 40);
  const Kv a = SyntheticKv(300, kN, 8), b = SyntheticKv(300, kN, 9), c = SyntheticKv(700, kN, 10);
  const std::vector<uint32_t> ids_a = testing::PromptIds(300, 8), ids_b = testing::PromptIds(300, 9);
  ASSERT_TRUE(PushAllIds(*t.h, "a", a, &ids_a, 0, 300).ok());  // 16 pages
  ASSERT_TRUE(PushAllIds(*t.h, "b", b, &ids_b, 0, 300).ok());  // 16 pages
  ASSERT_TRUE(ForkPrefix(*t.h, ids_a, "fa", 128).ok());        // holds a's first 4 pages of each layer
  ASSERT_TRUE(Release(*t.h, "a").ok());                        // 8 + 8 - 4 - 4 cached only
  const std::string live_b = Answers(*t.h, "b"), live_fa = Answers(*t.h, "fa");
  EXPECT_EQ(t.Stats().pages_in_use(), 32u);
  // 10 more pages needed, 8 free: the least recent of a's pages that only
  // the index holds go (the fork's were made recent by the fork).
  ASSERT_TRUE(PushAllIds(*t.h, "c", c, nullptr, 0, 220, 220).ok());  // 5 pages per layer
  EXPECT_EQ(t.h->prefix_index().evictions(), 2u);
  EXPECT_EQ(t.metrics.prefix_evictions->Value(), 2.0);
  EXPECT_EQ(Answers(*t.h, "b"), live_b);
  EXPECT_EQ(Answers(*t.h, "fa"), live_fa);
  v1::LookupResponse r = testing::LookupIds(*t.h, ids_a);
  EXPECT_EQ(r.layer_pages(0), 4u);  // pages 4 and 5 of layer 0 went
  EXPECT_EQ(r.layer_pages(1), 8u);
  EXPECT_EQ(r.miss_reason(), v1::MISS_EVICTED);
  // 6 more: a's other cached pages; then nothing else can go.
  ASSERT_TRUE(PushIds(*t.h, "c", 0, c, nullptr, 220, 128, 128).ok());  // 4 pages
  ASSERT_TRUE(PushIds(*t.h, "c", 1, c, nullptr, 220, 64, 64).ok());    // 2 pages
  EXPECT_EQ(t.h->prefix_index().evictions(), 8u);
  EXPECT_EQ(t.Stats().pages_in_use(), 40u);
  absl::Status st = PushIds(*t.h, "c", 0, c, nullptr, 348, 128, 128);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_EQ(Answers(*t.h, "b"), live_b);
  EXPECT_EQ(Answers(*t.h, "fa"), live_fa);
  EXPECT_EQ(testing::LookupIds(*t.h, ids_b).pages(), 8u);
  for (const char* id : {"b", "c", "fa"}) ASSERT_TRUE(Release(*t.h, id).ok());
  EXPECT_EQ(t.h->prefix_index().EvictAll(), 24);
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  for (PageId p = 0; p < 40; ++p) EXPECT_EQ(t.h->pool().references(p), 0) << p;
  EXPECT_EQ(t.h->prefix_index().entries(), 0);
}

// A decode step that seals a page in a full pool evicts a cached page,
// as an Append does (both reserve through the pool's reclaimer), and its
// layer answers as a sequence given the token by Append.
TEST(PrefixCache, ADecodeStepInAFullPoolEvictsACachedPage) {
  size_t stride = 0;
  {
    TestHandler probe(SmallOptions());
    stride = probe.h->pool().page_stride();
  }
  TestHandler t(SmallOptions(40 * stride)), ref(SmallOptions());
  const Kv a = SyntheticKv(300, kN, 14), b = SyntheticKv(448, kN, 15);
  const std::vector<uint32_t> ids = testing::PromptIds(300, 14);
  ASSERT_TRUE(PushAllIds(*t.h, "a", a, &ids, 0, 300).ok());  // 16 pages
  ASSERT_TRUE(Release(*t.h, "a").ok());                      // cached
  // 447 tokens: 12 pages per layer and a window of R + P - 1 = 63.
  ASSERT_TRUE(PushAllIds(*t.h, "b", b, nullptr, 0, 447).ok());
  ASSERT_EQ(t.Stats().pages_in_use(), 40u);
  ASSERT_EQ(t.h->prefix_index().evictions(), 0u);
  v1::AttendRequest req;
  v1::AttendItem* it = req.add_items();
  *it = testing::QueryItem("b", 0, SyntheticQuery(kQHeads, kD, 3), kQHeads);
  FloatToTensor(b.keys.data() + 447 * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
  FloatToTensor(b.values.data() + 447 * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
  it->set_new_token_index(447);
  v1::AttendResponse resp;
  absl::Status st = t.h->Attend(req, &resp);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(t.h->prefix_index().evictions(), 1u);
  EXPECT_EQ(t.Stats().pages_in_use(), 40u);
  ASSERT_TRUE(PushIds(*ref.h, "b", 0, b, nullptr, 0, 448).ok());
  EXPECT_EQ(testing::ReadLayerBytes(*t.h, "b", 0), testing::ReadLayerBytes(*ref.h, "b", 0));
}

TEST(PrefixCache, RefusalsNameTheFieldAndChangeNothing) {
  TestHandler t(SmallOptions());
  const Kv kv = SyntheticKv(200, kN, 11);
  const std::vector<uint32_t> ids = testing::PromptIds(200, 11);
  ASSERT_TRUE(PushAllIds(*t.h, "s", kv, &ids, 0, 200).ok());
  const v1::StatsResponse before = t.Stats();
  v1::LookupRequest both;
  both.add_token_ids(1);
  both.add_page_keys(std::string(16, 'k'));
  v1::LookupResponse lr;
  EXPECT_EQ(t.h->Lookup(both, &lr),
            absl::InvalidArgumentError("token_ids and page_keys are both set; send one or the other"));
  EXPECT_EQ(t.h->Lookup(v1::LookupRequest(), &lr),
            absl::InvalidArgumentError(
                "token_ids and page_keys are both empty; send the prompt's token ids or its page keys"));
  v1::LookupRequest short_key;
  short_key.add_page_keys(std::string(16, 'k'));
  short_key.add_page_keys("abc");
  EXPECT_EQ(t.h->Lookup(short_key, &lr), absl::InvalidArgumentError("page_keys[1] has 3 bytes; a page key has 16"));

  struct Case {
    v1::ForkRequest req;
    absl::Status want;
  };
  std::vector<Case> cases;
  auto with_ids = [&](int count) {
    v1::ForkRequest r;
    r.set_sequence_id("x");
    for (int i = 0; i < count; ++i) r.add_prefix_token_ids(ids[i]);
    return r;
  };
  {
    v1::ForkRequest r = with_ids(64);
    r.set_source_sequence_id("s");
    cases.push_back({r, absl::InvalidArgumentError("source_sequence_id \"s\" and a prefix (prefix_token_ids or "
                                                   "prefix_page_keys) are both set; name one source")});
  }
  {
    v1::ForkRequest r = with_ids(64);
    r.set_tokens(48);
    cases.push_back({r, absl::InvalidArgumentError("tokens 48 is not a multiple of page_tokens 32; with a prefix it "
                                                   "bounds the whole pages taken (0: no bound)")});
  }
  cases.push_back({with_ids(31), absl::InvalidArgumentError("prefix_token_ids has 31 ids, fewer than page_tokens 32: "
                                                            "a fork shares whole pages")});
  {
    v1::ForkRequest r = with_ids(64);
    r.add_prefix_page_keys(std::string(16, 'k'));
    cases.push_back(
        {r, absl::InvalidArgumentError("prefix_token_ids and prefix_page_keys are both set; send one or the other")});
  }
  {
    v1::ForkRequest r = with_ids(0);
    r.add_prefix_page_keys(std::string(17, 'k'));
    cases.push_back({r, absl::InvalidArgumentError("prefix_page_keys[0] has 17 bytes; a page key has 16")});
  }
  {
    v1::ForkRequest r = with_ids(0);
    r.add_prefix_page_keys(std::string(16, 'k'));
    cases.push_back({r, absl::NotFoundError("no stored prefix of the prompt for sequence_id \"x\": page 0 (tokens "
                                            "[0, 32)) of layer 0 was never stored with token_ids by this tenant "
                                            "under this codec")});
  }
  {
    v1::ForkRequest r = with_ids(64);
    r.set_sequence_id("s");
    cases.push_back(
        {r, absl::AlreadyExistsError("sequence_id \"s\" already exists; fork into a new id, or release it first")});
  }
  for (const Case& c : cases) {
    v1::ForkResponse resp;
    EXPECT_EQ(t.h->Fork(c.req, &resp), c.want) << c.req.ShortDebugString();
    const v1::StatsResponse after = t.Stats();
    EXPECT_EQ(after.pages_in_use(), before.pages_in_use());
    EXPECT_EQ(after.sequences(), before.sequences());
    EXPECT_EQ(after.tenant_pages(), before.tenant_pages());
    EXPECT_EQ(after.tenant_bytes(), before.tenant_bytes());
  }
  EXPECT_EQ(t.h->prefix_index().entries(), 2 * 5);
  for (PageId p = 0; p < 10; ++p) EXPECT_EQ(t.h->pool().references(p), 2) << p;
}

// A fork of a sequence keeps its ids: its own later pages are indexed too.
TEST(PrefixCache, AForkOfASequenceIndexesItsLaterPages) {
  TestHandler t(SmallOptions());
  const Kv kv = SyntheticKv(460, kN, 12);
  const std::vector<uint32_t> ids = testing::PromptIds(460, 12);
  ASSERT_TRUE(PushAllIds(*t.h, "src", kv, &ids, 0, 200).ok());  // 5 pages
  v1::ForkRequest req;
  req.set_source_sequence_id("src");
  req.set_sequence_id("f");
  req.set_tokens(128);
  v1::ForkResponse resp;
  ASSERT_TRUE(t.h->Fork(req, &resp).ok());
  ASSERT_TRUE(PushAllIds(*t.h, "f", kv, &ids, 128, 332).ok());  // 13 pages
  EXPECT_EQ(testing::LookupIds(*t.h, ids).pages(), 13u);
  EXPECT_EQ(t.h->prefix_index().entries(), 2 * 13);
}

// Threads appending with ids over one shared prompt, forking from it,
// looking it up, attending and releasing, in a pool small enough to evict:
// every fork reads back as its prompt's tokens, and everything returns to
// zero.
TEST(PrefixCache, ConcurrentAppendsForksLookupsAndEvictions) {
  size_t stride = 0;
  {
    TestHandler probe(SmallOptions());
    stride = probe.h->pool().page_stride();
  }
  TestHandler t(SmallOptions(72 * stride));
  // Prompt 0 is shared by every thread; prompts 1-4 are one thread's each,
  // and their cached pages fill the pool until some are evicted.
  constexpr int kPrompts = 5, kTokens = 400;
  std::vector<Kv> kv;
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::string> expected;
  TestHandler ref(SmallOptions());
  for (int i = 0; i < kPrompts; ++i) {
    kv.push_back(SyntheticKv(kTokens, kN, 20 + i));
    ids.push_back(testing::PromptIds(kTokens, 20 + i));
    const std::string id = absl::StrCat("whole", i);
    ASSERT_TRUE(PushAllIds(*ref.h, id, kv[i], &ids[i], 0, kTokens).ok());
    expected.push_back(Stored(*ref.h, id));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 8; ++i) {
        const int prompt = i % 2 == 0 ? 0 : 1 + w;
        const std::string id = absl::StrCat("t", w, "-", i);
        absl::StatusOr<v1::ForkResponse> f = ForkPrefix(*t.h, ids[prompt], id);
        const int from = f.ok() ? static_cast<int>(f->tokens()) : 0;
        absl::Status st = PushAllIds(*t.h, id, kv[prompt], &ids[prompt], from, kTokens - from, 61 + w);
        if (st.ok()) {
          const v1::LookupResponse r = testing::LookupIds(*t.h, ids[prompt]);
          if (r.pages() < static_cast<uint64_t>(from / kP)) ++failures;
          if (AttendBytes(*t.h, id, 0).empty()) ++failures;
          if (Stored(*t.h, id) != expected[prompt]) ++failures;
        } else if (st.code() != C::kResourceExhausted) {
          ++failures;
        }
        (void)Release(*t.h, id);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(t.h->prefix_index().evictions(), 0u);
  t.h->prefix_index().EvictAll();
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  EXPECT_EQ(t.Stats().sequences(), 0u);
}

}  // namespace
}  // namespace driftkv
