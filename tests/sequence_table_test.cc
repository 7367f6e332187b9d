// SequenceTable (service/sequence_table.h) on its own, without requests:
// creation and lookup, tenant isolation, the global and per-tenant
// max_sequences, tombstones after a release (and new incarnations), idle
// expiry on a fake clock, what a release frees, placement on the least
// loaded device slot, dropping an empty new sequence, the drain, restore.
#include <memory>
#include <string>
#include <vector>

#include "backends/page_format.h"
#include "codec/kv_codec.h"
#include "gtest/gtest.h"
#include "service/metrics.h"
#include "service/sequence_table.h"
#include "service/tenant.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

constexpr int kN = 128;  // 2 KV heads x 64

// A table over a cold pool of `slots` device slots, no hot tier, on a
// clock the test moves.
class Table {
 public:
  explicit Table(ServiceOptions o, int slots = 1) : options_(std::move(o)) {
    codec_ = *MakeKvCodec(options_.codec_options());
    pool_ = *PagePool::Create(*MakePageLayoutFor(options_.page_format, *codec_), options_.pool_bytes, slots);
    std::vector<int> ids;
    for (int k = 0; k < slots; ++k) ids.push_back(10 + k);
    table_ = std::make_unique<SequenceTable>(
        options_, kN, *pool_, nullptr, &metrics_, [this] { return now; }, ids);
  }
  SequenceTable* operator->() { return table_.get(); }
  absl::StatusOr<SequencePtr> Create(const std::string& tenant, const std::string& id, bool new_incarnation = false,
                                     bool* created = nullptr) {
    bool made = false;
    absl::StatusOr<SequencePtr> s =
        table_->FindOrCreate(TenantKey(tenant, id), id, tenant, new_incarnation, created ? created : &made);
    return s;
  }
  // Gives layer 0 of `seq` `pages` pages of its slot and `window` window
  // tokens, charged and counted as an append would.
  void Fill(const SequencePtr& seq, int pages, int window) {
    LayerState& l = seq->layers[0];
    ASSERT_TRUE(seq->usage->ChargePages(pages).ok());
    std::vector<PageId> got = *pool_->Reserve(pages, seq->device);
    l.pages.insert(l.pages.end(), got.begin(), got.end());
    l.page_sums.resize(l.pages.size());
    l.window_keys.resize(static_cast<size_t>(window) * kN);
    l.window_values.resize(l.window_keys.size());
    l.length += static_cast<int64_t>(pages) * pool_->page_tokens() + window;
    table_->CountTokens(static_cast<int64_t>(pages) * pool_->page_tokens(), window);
  }
  PagePool& pool() { return *pool_; }
  absl::Time now = absl::UnixEpoch();

 private:
  ServiceOptions options_;
  Metrics metrics_;
  std::unique_ptr<KvCodec> codec_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<SequenceTable> table_;
};

ServiceOptions Options() {
  ServiceOptions o = testing::SmallOptions(4u << 20);
  o.max_sequences = 4;
  o.tombstone_seconds = 60;
  return o;
}

TEST(SequenceTableTest, CreatesOnceAndFinds) {
  Table t(Options());
  bool created = false;
  absl::StatusOr<SequencePtr> a = t.Create("", "a", false, &created);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(created);
  EXPECT_EQ((*a)->layers.size(), 2u);
  absl::StatusOr<SequencePtr> again = t.Create("", "a", false, &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(again->get(), a->get());
  EXPECT_EQ(t->Find("a").get(), a->get());
  EXPECT_EQ(t->Find("b"), nullptr);
  EXPECT_EQ(t->size(), 1u);
}

TEST(SequenceTableTest, TenantsSeeOnlyTheirOwn) {
  Table t(Options());
  absl::StatusOr<SequencePtr> alice = t.Create("alice", "x");
  absl::StatusOr<SequencePtr> bob = t.Create("bob", "x");
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_NE(alice->get(), bob->get());
  EXPECT_EQ(t->Find(TenantKey("alice", "x")).get(), alice->get());
  EXPECT_EQ(t->Find("x"), nullptr);  // the anonymous tenant's key
  EXPECT_EQ(t->FindTenant("alice")->sequences(), 1);
  EXPECT_EQ(t->FindTenant("carol"), nullptr);
  EXPECT_EQ((*alice)->usage, t->FindTenant("alice"));
}

TEST(SequenceTableTest, MaxSequencesAndTenantQuota) {
  ServiceOptions o = Options();
  o.tenant_defaults.max_sequences = 2;
  Table t(o);
  ASSERT_TRUE(t.Create("a", "1").ok());
  ASSERT_TRUE(t.Create("a", "2").ok());
  absl::StatusOr<SequencePtr> third = t.Create("a", "3");
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("\"3\""), std::string::npos) << third.status();
  EXPECT_EQ(t->FindTenant("a")->sequences(), 2);  // nothing charged for the refusal
  ASSERT_TRUE(t.Create("b", "1").ok());
  ASSERT_TRUE(t.Create("b", "2").ok());
  absl::StatusOr<SequencePtr> fifth = t.Create("c", "1");  // max_sequences 4 for all
  EXPECT_TRUE(absl::IsResourceExhausted(fifth.status())) << fifth.status();
  EXPECT_NE(fifth.status().message().find("max_sequences 4"), std::string::npos) << fifth.status();
  EXPECT_EQ(t->size(), 4u);
}

TEST(SequenceTableTest, ReleaseFreesAndTombstones) {
  Table t(Options());
  SequencePtr s = *t.Create("", "a");
  t.Fill(s, 3, 5);
  EXPECT_EQ(t.pool().pages_in_use(), 3);
  uint64_t tokens = 0, pages = 0;
  ASSERT_TRUE(t->Release("a", "a", &tokens, &pages).ok());
  EXPECT_EQ(pages, 3u);
  EXPECT_EQ(tokens, 3u * t.pool().page_tokens() + 5);
  EXPECT_EQ(t.pool().pages_in_use(), 0);
  EXPECT_EQ(s->usage->pages(), 0);
  EXPECT_EQ(s->usage->sequences(), 0);
  EXPECT_EQ(t->tokens_compressed(), 0);
  EXPECT_EQ(t->tokens_window(), 0);
  EXPECT_EQ(t->sequences_released(), 1u);
  {
    absl::ReaderMutexLock lock(&s->mu);
    EXPECT_TRUE(s->released);  // a stale pointer sees it
  }
  EXPECT_TRUE(absl::IsNotFound(t->Release("a", "a", &tokens, &pages)));
  // Tombstoned: a plain create is refused, a new incarnation is not.
  absl::StatusOr<SequencePtr> again = t.Create("", "a");
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(t->CheckTombstone("a", "a")));
  EXPECT_EQ(t->PurgeTombstones(), 1u);
  ASSERT_TRUE(t.Create("", "a", /*new_incarnation=*/true).ok());
  t->EraseTombstone("a");
  EXPECT_TRUE(t->CheckTombstone("a", "a").ok());
  // Tombstones end after tombstone_seconds.
  ASSERT_TRUE(t->Release("a", "a", &tokens, &pages).ok());
  t.now += absl::Seconds(61);
  EXPECT_TRUE(t->CheckTombstone("a", "a").ok());
  EXPECT_EQ(t->PurgeTombstones(), 0u);
  EXPECT_TRUE(t.Create("", "a").ok());
}

TEST(SequenceTableTest, ExpiresIdleSequencesWithoutTombstones) {
  ServiceOptions o = Options();
  o.ttl_seconds = 10;
  Table t(o);
  SequencePtr old_one = *t.Create("", "old");
  t.Fill(old_one, 1, 0);
  t.now += absl::Seconds(5);
  SequencePtr young = *t.Create("", "young");
  t.now += absl::Seconds(6);  // old: 11 s idle, young: 6 s
  EXPECT_EQ(t->ExpireIdle(), 1);
  EXPECT_EQ(t->Find("old"), nullptr);
  EXPECT_EQ(t->Find("young").get(), young.get());
  EXPECT_EQ(t.pool().pages_in_use(), 0);
  EXPECT_EQ(t->sequences_expired(), 1u);
  t->Touch(young.get());  // an access restarts the TTL
  t.now += absl::Seconds(9);
  EXPECT_EQ(t->ExpireIdle(), 0);
  EXPECT_TRUE(t.Create("", "old").ok());  // expiry leaves no tombstone
}

TEST(SequenceTableTest, NoTtlNoExpiry) {
  Table t(Options());  // ttl_seconds 0
  ASSERT_TRUE(t.Create("", "a").ok());
  t.now += absl::Hours(1000);
  EXPECT_EQ(t->ExpireIdle(), 0);
  EXPECT_EQ(t->size(), 1u);
}

TEST(SequenceTableTest, PlacesOnTheLeastLoadedSlot) {
  Table t(Options(), /*slots=*/2);
  SequencePtr a = *t.Create("", "a");
  SequencePtr b = *t.Create("", "b");
  EXPECT_EQ(a->device, 0);
  EXPECT_EQ(b->device, 1);  // equal pages: fewer sequences
  t.Fill(a, 2, 0);
  SequencePtr c = *t.Create("", "c");
  EXPECT_EQ(c->device, 1);  // fewer pages in use
  EXPECT_EQ(t->device_sequences(0), 1);
  EXPECT_EQ(t->device_sequences(1), 2);
  EXPECT_EQ(t->device_ids(), (std::vector<int>{10, 11}));
  uint64_t tokens = 0, pages = 0;
  ASSERT_TRUE(t->Release("b", "b", &tokens, &pages).ok());
  EXPECT_EQ(t->device_sequences(1), 1);
}

TEST(SequenceTableTest, DropsOnlyAnEmptyNewSequence) {
  Table t(Options());
  SequencePtr empty = *t.Create("", "e");
  SequencePtr full = *t.Create("", "f");
  t.Fill(full, 0, 3);
  t->DropIfEmpty(empty);
  t->DropIfEmpty(full);
  EXPECT_EQ(t->Find("e"), nullptr);
  EXPECT_EQ(t->Find("f").get(), full.get());
  EXPECT_EQ(empty->usage->sequences(), 1);
  EXPECT_TRUE(t.Create("", "e").ok());  // no tombstone
}

TEST(SequenceTableTest, DrainRefusesNewSequencesOnly) {
  Table t(Options());
  SequencePtr a = *t.Create("", "a");
  t->BeginDrain();
  EXPECT_TRUE(t->draining());
  absl::StatusOr<SequencePtr> b = t.Create("", "b");
  EXPECT_TRUE(absl::IsUnavailable(b.status())) << b.status();
  absl::StatusOr<SequencePtr> again = t.Create("", "a");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), a.get());
}

TEST(SequenceTableTest, AdoptsRestoredSequences) {
  ServiceOptions o = Options();
  o.max_sequences = 1;
  Table t(o);
  TenantUsage* usage = t->Usage("alice");
  auto s = std::make_shared<Sequence>(TenantKey("alice", "r"), 2, usage, t->PlaceNew());
  ASSERT_TRUE(t->Adopt(s, 3).ok());
  EXPECT_EQ(usage->pages(), 3);
  EXPECT_EQ(usage->sequences(), 1);
  EXPECT_EQ(t->Find(TenantKey("alice", "r")).get(), s.get());
  auto twin = std::make_shared<Sequence>(TenantKey("alice", "r"), 2, usage, 0);
  EXPECT_FALSE(t->Adopt(twin, 0).ok());  // max_sequences 1 (and a repeated id)
  t->Unadopt(s, 3);
  EXPECT_EQ(t->Find(TenantKey("alice", "r")), nullptr);
  EXPECT_EQ(usage->pages(), 0);
  EXPECT_EQ(usage->sequences(), 0);
}

}  // namespace
}  // namespace driftkv
