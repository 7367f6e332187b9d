// WatchPages through the handler (docs/prefix_cache.md, "Events for
// routers"): a subscriber sees its tenant's pages stored and evicted, in
// order, and nothing of another tenant's; a slow subscriber's buffer stays
// bounded and the next message says how many events it missed; sizes out
// of range are refused; the subscription ends with the call.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/page_key.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SyntheticKv;
using testing::TestHandler;
using C = absl::StatusCode;

constexpr int kN = testing::kSmallN, kLayers = 2, kP = 32;

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

void Release(Handler& h, const std::string& seq, const std::string& tenant = "") {
  v1::ReleaseRequest req;
  req.set_sequence_id(seq);
  v1::ReleaseResponse resp;
  ASSERT_TRUE(h.Release(req, &resp, tenant).ok());
}

// A WatchPages call on its own thread, collecting what it is sent.
class Watcher {
 public:
  Watcher(Handler& h, const std::string& tenant, v1::WatchPagesRequest req = {}) {
    thread_ = std::thread([this, &h, tenant, req] {
      status_ = h.WatchPages(
          req,
          [this](const v1::PageEventBatch& b) {
            absl::MutexLock lock(&mu_);
            batches_.push_back(b);
            return true;
          },
          [this] {
            subscribed_.store(true);
            return stop_.load();
          },
          tenant, absl::Milliseconds(5));
    });
    while (!subscribed_.load()) std::this_thread::yield();
  }
  // Waits until `events` events (and drops) arrived or 5 s passed.
  std::vector<v1::PageEventBatch> Await(size_t events) {
    for (int i = 0; i < 1000; ++i) {
      {
        absl::MutexLock lock(&mu_);
        size_t n = 0;
        for (const v1::PageEventBatch& b : batches_) n += b.events_size() + b.dropped();
        if (n >= events) return batches_;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  absl::Status Stop() {
    stop_.store(true);
    thread_.join();
    return status_;
  }

 private:
  std::thread thread_;
  std::atomic<bool> stop_{false}, subscribed_{false};
  absl::Mutex mu_;
  std::vector<v1::PageEventBatch> batches_ ABSL_GUARDED_BY(mu_);
  absl::Status status_;
};

// "S<layer>:<hex key>" / "E<layer>:<hex key>" for each event.
std::vector<std::string> Names(const std::vector<v1::PageEventBatch>& batches) {
  std::vector<std::string> out;
  for (const v1::PageEventBatch& b : batches) {
    for (const v1::PageEvent& e : b.events()) {
      PageKey k;
      EXPECT_TRUE(PageKey::FromBytes(e.page_key(), &k));
      out.push_back(absl::StrCat(e.kind() == v1::PAGE_STORED ? "S" : "E", e.layer(), ":", k.Hex()));
    }
  }
  return out;
}

TEST(PageEvents, ASubscriberSeesItsTenantsPagesStoredAndEvicted) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("page-events", "", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  Watcher alice(*t.h, "alice"), bob(*t.h, "bob");
  const std::vector<uint32_t> ids = Ids(100, 1);  // 2 pages per layer (a window of 32)
  Push(*t.h, "a", ids, "alice");
  std::vector<PageKey> keys;
  ChainPageKeys(ids, kP, &keys);
  std::vector<std::string> want;
  for (int l = 0; l < kLayers; ++l) {
    for (int i = 0; i < 2; ++i) want.push_back(absl::StrCat("S", l, ":", keys[i].Hex()));
  }
  EXPECT_EQ(Names(alice.Await(4)), want);
  Release(*t.h, "a", "alice");
  EXPECT_EQ(t.h->prefix_index().EvictAll(), 4);
  const std::vector<std::string> all = Names(alice.Await(8));
  ASSERT_EQ(all.size(), 8u);
  for (size_t i = 4; i < 8; ++i) EXPECT_EQ(all[i][0], 'E') << all[i];
  EXPECT_EQ(alice.Stop().code(), C::kCancelled);
  EXPECT_TRUE(Names(bob.Await(0)).empty());
  EXPECT_EQ(bob.Stop().code(), C::kCancelled);
}

// In a shared prefix namespace, a subscriber sees the pages every tenant
// of it stores; a tenant outside it sees none.
TEST(PageEvents, ASharedNamespacesSubscribersSeeEachOthersPages) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions(
      "page-events-shared", "prefix_namespaces { name: \"team\" tenants: \"alice\" tenants: \"bob\" }",
      {"alice", "bob", "carol"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  Watcher bob(*t.h, "bob"), carol(*t.h, "carol");
  const std::vector<uint32_t> ids = Ids(100, 3);
  Push(*t.h, "a", ids, "alice");
  std::vector<PageKey> keys;
  ChainPageKeys(ids, kP, &keys);
  std::vector<std::string> want;
  for (int l = 0; l < kLayers; ++l) {
    for (int i = 0; i < 2; ++i) want.push_back(absl::StrCat("S", l, ":", keys[i].Hex()));
  }
  EXPECT_EQ(Names(bob.Await(4)), want);
  EXPECT_EQ(bob.Stop().code(), C::kCancelled);
  EXPECT_TRUE(Names(carol.Await(0)).empty());
  EXPECT_EQ(carol.Stop().code(), C::kCancelled);
}

// A buffer of 3 events and a subscriber that does not read: 8 events
// leave 3 buffered and 5 counted, then reported once.
TEST(PageEvents, ASlowSubscriberStaysBoundedAndIsToldWhatItMissed) {
  TestHandler t(testing::SmallOptions());
  absl::StatusOr<std::shared_ptr<PageEvents::Subscriber>> s =
      t.h->page_events().Subscribe(NamespaceKey(t.h->SnapshotIdentity(), ""), 3);
  ASSERT_TRUE(s.ok());
  Push(*t.h, "a", Ids(164, 2));  // 4 pages per layer
  std::vector<PageEvents::Event> got;
  EXPECT_EQ((*s)->Take(absl::ZeroDuration(), 100, &got), 5u);
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ((*s)->Take(absl::ZeroDuration(), 100, &got), 0u);
  EXPECT_TRUE(got.empty());
  t.h->page_events().Unsubscribe(*s);
  // Through the RPC's handler: a message with dropped set.
  v1::WatchPagesRequest req;
  req.set_buffer_events(2);
  req.set_max_batch(1);
  std::atomic<bool> pushed{false};
  std::vector<v1::PageEventBatch> batches;
  absl::Status st = t.h->WatchPages(
      req,
      [&](const v1::PageEventBatch& b) {
        batches.push_back(b);
        return true;
      },
      [&] {
        if (!pushed.exchange(true)) Push(*t.h, "b", Ids(164, 3));  // 8 events into a buffer of 2
        return batches.size() >= 2;
      },
      "", absl::Milliseconds(5));
  EXPECT_EQ(st.code(), C::kCancelled);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].events_size(), 1);
  EXPECT_EQ(batches[0].dropped(), 6u);
  EXPECT_EQ(batches[1].events_size(), 1);
  EXPECT_EQ(batches[1].dropped(), 0u);
}

TEST(PageEvents, SizesOutOfRangeAreRefused) {
  TestHandler t(testing::SmallOptions());
  v1::WatchPagesRequest req;
  req.set_max_batch(5000);
  auto never = [] { return true; };
  auto sink = [](const v1::PageEventBatch&) { return true; };
  EXPECT_EQ(t.h->WatchPages(req, sink, never).message(), "max_batch 5000 exceeds 4096 events per message");
  req.set_max_batch(0);
  req.set_buffer_events(2u << 20);
  EXPECT_EQ(t.h->WatchPages(req, sink, never).message(), "buffer_events 2097152 exceeds 1048576 events");
  req.set_buffer_events(0);
  EXPECT_EQ(t.h->WatchPages(req, sink, never).code(), C::kCancelled);
  // A client that stops reading ends the call, and its subscription.
  auto pushed = std::make_shared<bool>(false);
  absl::Status st = t.h->WatchPages(
      req, [](const v1::PageEventBatch&) { return false; },
      [&] {
        if (!*pushed) Push(*t.h, "a", Ids(100, 1));
        *pushed = true;
        return false;
      },
      "", absl::Milliseconds(5));
  EXPECT_EQ(st, absl::CancelledError("WatchPages: the client stopped reading"));
  // Every subscription ended: kMaxSubscribers fit again.
  std::vector<std::shared_ptr<PageEvents::Subscriber>> subs;
  for (int i = 0; i < PageEvents::kMaxSubscribers; ++i) {
    absl::StatusOr<std::shared_ptr<PageEvents::Subscriber>> s = t.h->page_events().Subscribe(PageKey{}, 1);
    ASSERT_TRUE(s.ok()) << i;
    subs.push_back(*s);
  }
  EXPECT_EQ(t.h->page_events().Subscribe(PageKey{}, 1).status().code(), C::kResourceExhausted);
  for (const auto& s : subs) t.h->page_events().Unsubscribe(s);
}

}  // namespace
}  // namespace driftkv
