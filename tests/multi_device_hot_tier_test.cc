// The hot tier on a server of several devices, CPU backend (one backend a
// device behind backends/multi_device.h, as on GPUs): the hot pool has a
// partition a device, and every layer moves only within its sequence's
// device. Attend is bit-equal to one device and to no hot tier (sync
// promotion of a batch across both devices, decode steps, an Append that
// adds pages to hot layers, a demotion and a second promotion); room is
// made by demoting a layer of the same device, never of the other; a
// demotion puts the pages back on the layer's device; Info, Stats and the
// per-device gauges show each device's share.
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

// 2 layers x 2 KV heads x 64 (n = 128); level pages need P = 128.
constexpr int kN = 128, kD = 64, kP = 128, kQHeads = 4;
// 700 tokens: 4 pages and a 188-token window; a sequence's two layers hold
// 8 pages.
constexpr int kTokens = 700, kPagesPerSequence = 8;

// `hot_pages` level pages for the whole server (split over its devices).
ServiceOptions Options(std::vector<int> devices, int hot_pages) {
  ServiceOptions o = SmallOptions(8u << 20);
  o.codec.mean_window = kP;
  o.window_tokens = 128;
  o.devices = std::move(devices);
  o.hot_tier_bytes = static_cast<uint64_t>(hot_pages) * MakeLevelPageLayout(2, kD)->page_bytes;
  return o;
}

std::string SeqName(int i) {
  return "s" + std::to_string(i);
}

// Both layers of `sequences` sequences, the decode step's token with
// `step_seed` (0: none).
v1::AttendRequest Batch(const std::vector<int>& sequences, uint32_t seed, uint32_t step_seed) {
  v1::AttendRequest req;
  for (int i : sequences) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      v1::AttendItem* it = req.add_items();
      *it = QueryItem(SeqName(i), layer, SyntheticQuery(kQHeads, kD, seed + 10 * i + layer), kQHeads);
      if (step_seed != 0) {
        const testing::Kv t = SyntheticKv(1, kN, step_seed + 10 * i + layer);
        FloatToTensor(t.keys.data(), t.keys.size(), v1::DTYPE_F32, it->mutable_new_key());
        FloatToTensor(t.values.data(), t.values.size(), v1::DTYPE_F32, it->mutable_new_value());
      }
    }
  }
  return req;
}

// The value of gauge `name` with exactly `labels`; -1 if absent.
double Gauge(const Metrics& m, const std::string& name, const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : m.registry()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      std::map<std::string, std::string> have;
      for (const prometheus::ClientMetric::Label& l : c.label) have[l.name] = l.value;
      if (have == labels) return c.gauge.value;
    }
  }
  return -1;
}

// The answers' bytes, output and lse.
std::vector<std::string> Answers(Handler& h, const v1::AttendRequest& req) {
  v1::AttendResponse resp;
  absl::Status st = h.Attend(req, &resp);
  EXPECT_TRUE(st.ok()) << st;
  std::vector<std::string> out;
  for (const v1::AttendResult& r : resp.results()) {
    out.push_back(r.output() +
                  std::string(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * sizeof(float)));
  }
  return out;
}

// Every page of a device's sequences is in that device's partitions: its
// cold and hot pages in use, less the cold copies of its hot layers' pages
// (kept in the same partition), add up to its sequences' pages.
void ExpectPagesOnTheirDevices(Handler& h, const std::vector<int>& pages_per_sequence_on) {
  const v1::StatsResponse st = testing::StatsOf(h);
  ASSERT_EQ(st.devices_size(), 2);
  uint64_t hot = 0, copies = 0;
  for (int k = 0; k < 2; ++k) {
    const v1::DeviceStats& d = st.devices(k);
    EXPECT_EQ(d.pages_in_use() - d.cold_copy_pages() + d.hot_pages_in_use(),
              static_cast<uint64_t>(pages_per_sequence_on[k]) * d.sequences())
        << "device " << k;
    EXPECT_LE(d.cold_copy_pages(), d.hot_pages_in_use()) << "device " << k;
    copies += d.cold_copy_pages();
    EXPECT_EQ(d.hot_bytes_in_use(), d.hot_pages_in_use() * MakeLevelPageLayout(2, kD)->page_bytes);
    hot += d.hot_pages_in_use();
  }
  EXPECT_EQ(hot, st.hot_pages_in_use());
  EXPECT_EQ(copies, st.cold_copy_pages());
}

TEST(MultiDeviceHotTier, BitEqualToOneDeviceAndToNoHotTier) {
  testing::TestHandler cold(Options({}, 0)), one(Options({}, 96)), two(Options({0, 1}, 96));
  ASSERT_NE(two.h, nullptr);
  const int sequences = 6;
  for (testing::TestHandler* s : {&cold, &one, &two}) {
    for (int i = 0; i < sequences; ++i) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(s->Push(SeqName(i), layer, SyntheticKv(kTokens, kN, 3 * i + layer), 0, kTokens).ok());
      }
    }
  }
  v1::InfoResponse info;
  two.h->Info(&info);
  ASSERT_EQ(info.devices_size(), 2);
  EXPECT_EQ(info.devices(0).hot_capacity_pages() + info.devices(1).hot_capacity_pages(), info.hot_capacity_pages());
  EXPECT_EQ(info.devices(0).hot_capacity_pages(), 48u);
  EXPECT_EQ(info.devices(0).hot_capacity_bytes(), 48u * info.hot_page_bytes());
  const v1::StatsResponse placed = two.Stats();
  EXPECT_EQ(placed.devices(0).sequences(), 3u);
  EXPECT_EQ(placed.devices(1).sequences(), 3u);

  std::vector<int> all;
  for (int i = 0; i < sequences; ++i) all.push_back(i);
  // Attend (sync promotion of both devices' layers together), decode steps,
  // then plain again.
  for (uint32_t step : {0u, 500u, 600u, 0u}) {
    const v1::AttendRequest req = Batch(all, 40 + step, step);
    const std::vector<std::string> want = Answers(*cold.h, req);
    EXPECT_EQ(Answers(*one.h, req), want) << "step " << step;
    EXPECT_EQ(Answers(*two.h, req), want) << "step " << step;
  }
  for (int i = 0; i < sequences; ++i) EXPECT_TRUE(two.h->LayerIsHot(SeqName(i), 1)) << i;
  ExpectPagesOnTheirDevices(*two.h, {kPagesPerSequence, kPagesPerSequence});

  // New pages of hot layers (200 tokens more seal two pages in each layer:
  // the window goes from 190 to 390 tokens and seals down to 134) go hot
  // on their own device.
  for (testing::TestHandler* s : {&cold, &one, &two}) {
    for (int i = 0; i < sequences; ++i) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        // Tokens [702, 902) (the two decode steps made 702).
        const testing::Kv more = SyntheticKv(902, kN, 90 + 3 * i + layer);
        ASSERT_TRUE(s->Push(SeqName(i), layer, more, 702, 200).ok());
      }
    }
  }
  ExpectPagesOnTheirDevices(*two.h, {kPagesPerSequence + 4, kPagesPerSequence + 4});
  EXPECT_EQ(two.Stats().hot_pages_in_use(), static_cast<uint64_t>(sequences * (kPagesPerSequence + 4)));
  const v1::AttendRequest after = Batch(all, 77, 0);
  EXPECT_EQ(Answers(*two.h, after), Answers(*cold.h, after));

  // Idle demotion: every layer back to its device's cold partition; then
  // promoted again, the same bits.
  two.Advance(3600);
  two.h->ExpireIdle();
  for (int i = 0; i < sequences; ++i) EXPECT_FALSE(two.h->LayerIsHot(SeqName(i), 0)) << i;
  EXPECT_EQ(two.Stats().hot_pages_in_use(), 0u);
  ExpectPagesOnTheirDevices(*two.h, {kPagesPerSequence + 4, kPagesPerSequence + 4});
  EXPECT_EQ(Answers(*two.h, after), Answers(*cold.h, after));
  ExpectPagesOnTheirDevices(*two.h, {kPagesPerSequence + 4, kPagesPerSequence + 4});

  // Every item's route came back through the devices' wrapper: the routes
  // add up to the items, hot ones among them; the server without a hot
  // tier attended all on the host.
  auto route = [](const Metrics& m, AttendRoute r) { return m.attention_items_by_route[static_cast<int>(r)]->Value(); };
  double routed = 0;
  for (int k = 1; k < static_cast<int>(AttendRoute::kCount); ++k) routed += route(two.metrics, AttendRoute(k));
  EXPECT_EQ(routed, two.metrics.attention_items->Value());
  EXPECT_GT(route(two.metrics, AttendRoute::kHot), 0);
  EXPECT_GT(cold.metrics.attention_items->Value(), 0);
  EXPECT_EQ(route(cold.metrics, AttendRoute::kColdHost), cold.metrics.attention_items->Value());
}

// A server of two devices with every layer hot writes its snapshot (each
// hot layer demoted on its own device first) and a fresh one restores it:
// every sequence's pages on one device, the answers of a server without a
// hot tier, and the layers promoted on their devices again.
TEST(MultiDeviceHotTier, SnapshotAndRestore) {
  testing::TestHandler cold(Options({}, 0));
  auto two = std::make_unique<testing::TestHandler>(Options({0, 1}, 96));
  ASSERT_NE(two->h, nullptr);
  const int sequences = 6;
  for (testing::TestHandler* s : {&cold, two.get()}) {
    for (int i = 0; i < sequences; ++i) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(s->Push(SeqName(i), layer, SyntheticKv(kTokens, kN, 3 * i + layer), 0, kTokens).ok());
      }
    }
  }
  std::vector<int> all;
  for (int i = 0; i < sequences; ++i) all.push_back(i);
  const v1::AttendRequest req = Batch(all, 61, 0);
  const std::vector<std::string> want = Answers(*cold.h, req);
  EXPECT_EQ(Answers(*two->h, req), want);
  for (int i = 0; i < sequences; ++i) ASSERT_TRUE(two->h->LayerIsHot(SeqName(i), 0)) << i;

  const std::string dir = ::testing::TempDir() + "/multi_device_hot_snapshot";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Handler::SnapshotSummary written, loaded;
  ASSERT_TRUE(two->h->WriteSnapshot(dir, &written).ok());
  EXPECT_EQ(written.sequences, static_cast<uint64_t>(sequences));
  EXPECT_EQ(written.pages, static_cast<uint64_t>(sequences * kPagesPerSequence));
  EXPECT_EQ(two->Stats().hot_pages_in_use(), 0u);
  ExpectPagesOnTheirDevices(*two->h, {kPagesPerSequence, kPagesPerSequence});

  two.reset();
  two = std::make_unique<testing::TestHandler>(Options({0, 1}, 96));
  ASSERT_NE(two->h, nullptr);
  ASSERT_TRUE(two->h->LoadSnapshot(dir, &loaded).ok());
  EXPECT_EQ(loaded.sequences, static_cast<uint64_t>(sequences));
  EXPECT_EQ(loaded.dropped_sequences, 0u);
  ExpectPagesOnTheirDevices(*two->h, {kPagesPerSequence, kPagesPerSequence});
  const v1::StatsResponse placed = two->Stats();
  EXPECT_EQ(placed.devices(0).sequences() + placed.devices(1).sequences(), static_cast<uint64_t>(sequences));
  EXPECT_EQ(Answers(*two->h, req), want);
  for (int i = 0; i < sequences; ++i) EXPECT_TRUE(two->h->LayerIsHot(SeqName(i), 1)) << i;
  ExpectPagesOnTheirDevices(*two->h, {kPagesPerSequence, kPagesPerSequence});
  const v1::AttendRequest step = Batch(all, 62, 700);
  EXPECT_EQ(Answers(*two->h, step), Answers(*cold.h, step));
}

TEST(MultiDeviceHotTier, RoomIsMadeOnTheSequencesOwnDevice) {
  // 16 level pages: 8 a device, one sequence's two layers each.
  testing::TestHandler two(Options({0, 1}, 16));
  ASSERT_NE(two.h, nullptr);
  // s0 goes to device 0, s1 to device 1, s2 to the less loaded (a tie:
  // found from Stats).
  std::vector<uint64_t> seqs_before = {0, 0};
  int device_of[3];
  for (int i = 0; i < 3; ++i) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      ASSERT_TRUE(two.Push(SeqName(i), layer, SyntheticKv(kTokens, kN, 7 * i + layer), 0, kTokens).ok());
    }
    const v1::StatsResponse st = two.Stats();
    device_of[i] = st.devices(0).sequences() > seqs_before[0] ? 0 : 1;
    seqs_before = {st.devices(0).sequences(), st.devices(1).sequences()};
  }
  ASSERT_NE(device_of[0], device_of[1]);
  // The sequence that shares s2's device, and the one that does not.
  const int same = device_of[0] == device_of[2] ? 0 : 1, other = 1 - same;
  // `other` attended first: the least recently attended layers of the
  // server are on the other device.
  for (int i : {other, same}) {
    Answers(*two.h, Batch({i}, 5, 0));
    two.Advance(1);
  }
  EXPECT_TRUE(two.h->LayerIsHot(SeqName(0), 0) && two.h->LayerIsHot(SeqName(1), 0));
  // s2 needs its device's 8 pages: the layers of `same` make room, though
  // `other`'s are older, and `other` stays hot.
  Answers(*two.h, Batch({2}, 6, 0));
  EXPECT_TRUE(two.h->LayerIsHot(SeqName(2), 0));
  EXPECT_TRUE(two.h->LayerIsHot(SeqName(2), 1));
  EXPECT_FALSE(two.h->LayerIsHot(SeqName(same), 0));
  EXPECT_FALSE(two.h->LayerIsHot(SeqName(same), 1));
  EXPECT_TRUE(two.h->LayerIsHot(SeqName(other), 0));
  EXPECT_TRUE(two.h->LayerIsHot(SeqName(other), 1));
  EXPECT_EQ(two.Stats().demotions(), 2u);
  ExpectPagesOnTheirDevices(*two.h, {kPagesPerSequence, kPagesPerSequence});
  // The gauges of each device's share.
  for (int k = 0; k < 2; ++k) {
    const std::map<std::string, std::string> label = {{"device", std::to_string(k)}};
    EXPECT_EQ(Gauge(two.metrics, "driftkv_device_hot_capacity_pages", label), 8.0) << k;
    EXPECT_EQ(Gauge(two.metrics, "driftkv_device_hot_used_pages", label), 8.0) << k;
  }
}

// Placement counts a device's hot pages too: a device whose sequence went
// hot is not empty.
TEST(MultiDeviceHotTier, PlacementCountsHotPages) {
  testing::TestHandler two(Options({0, 1}, 32));
  ASSERT_NE(two.h, nullptr);
  auto device_of_new = [&](const std::string& name, int tokens, uint32_t seed) {
    const v1::StatsResponse before = two.Stats();
    EXPECT_TRUE(two.Push(name, 0, SyntheticKv(tokens, kN, seed), 0, tokens).ok());
    const v1::StatsResponse after = two.Stats();
    return after.devices(0).sequences() > before.devices(0).sequences() ? 0 : 1;
  };
  // A sequence of 4 pages, made hot; then one of 1 page on the other
  // device.
  const int big = device_of_new("big", kTokens, 1);
  v1::AttendRequest req;
  *req.add_items() = QueryItem("big", 0, SyntheticQuery(kQHeads, kD, 3), kQHeads);
  v1::AttendResponse resp;
  ASSERT_TRUE(two.h->Attend(req, &resp).ok());
  ASSERT_TRUE(two.h->LayerIsHot("big", 0));
  // Its cold pages are copies now, which placement does not count.
  EXPECT_EQ(two.Stats().devices(big).pages_in_use(), two.Stats().devices(big).cold_copy_pages());
  const int small = device_of_new("small", 300, 2);
  ASSERT_NE(small, big);
  // Cold pages alone would call big's device empty (0 against 1); with its
  // 4 hot pages it is the fuller one.
  EXPECT_EQ(device_of_new("next", 300, 3), small);
}

TEST(MultiDeviceHotTier, BudgetBelowAPageADeviceIsRefused) {
  Metrics m;
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(Options({0, 1}, 1), &m);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("for each of 2 devices"), std::string::npos) << h.status();
}

}  // namespace
}  // namespace driftkv
