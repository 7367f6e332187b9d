// A multi-device server without GPUs: the cpu backend with `devices` runs
// one backend per pool partition behind backends/multi_device.h, the same
// routing the cuda backend uses over GPUs. Sequences go to the least
// loaded device and stay; Attend over sequences of both devices (with
// decode steps) is bit-equal to one device; Stats/Info per device add up;
// a full device refuses as a whole.
#include <cstring>
#include <string>
#include <vector>

#include "backends/multi_device.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

std::unique_ptr<Handler> Make(Metrics* m, std::vector<int> devices, uint64_t pool = 8u << 20) {
  ServiceOptions o = SmallOptions(pool);
  o.devices = std::move(devices);
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, m);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *std::move(h) : nullptr;
}

absl::Status Append(Handler& h, const std::string& seq, uint32_t layer, int tokens, uint32_t seed) {
  const testing::Kv kv = SyntheticKv(tokens, 128, seed);
  v1::AppendResponse r;
  return h.Append(testing::ChunkOf(seq, layer, 0, tokens, kv), &r);
}

v1::AttendRequest Batch(int sequences, bool step) {
  v1::AttendRequest req;
  for (int i = 0; i < sequences; ++i) {
    v1::AttendItem* it = req.add_items();
    *it = testing::QueryItem("s" + std::to_string(i), i % 2, SyntheticQuery(4, 64, 100 + i), 4);
    if (step) {
      const testing::Kv t = SyntheticKv(1, 128, 200 + i);
      FloatToTensor(t.keys.data(), t.keys.size(), v1::DTYPE_F32, it->mutable_new_key());
      FloatToTensor(t.values.data(), t.values.size(), v1::DTYPE_F32, it->mutable_new_value());
    }
  }
  return req;
}

TEST(MultiDeviceTest, PlacementAndBitEqualAttention) {
  Metrics m1, m2;
  std::unique_ptr<Handler> one = Make(&m1, {});
  std::unique_ptr<Handler> two = Make(&m2, {0, 1});
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  const int sequences = 6;
  for (int i = 0; i < sequences; ++i) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      ASSERT_TRUE(Append(*one, "s" + std::to_string(i), layer, 150 + 40 * i, i * 2 + layer).ok());
      ASSERT_TRUE(Append(*two, "s" + std::to_string(i), layer, 150 + 40 * i, i * 2 + layer).ok());
    }
  }
  v1::StatsResponse st;
  two->Stats(&st);
  ASSERT_EQ(st.devices_size(), 2);
  EXPECT_EQ(st.devices(0).sequences() + st.devices(1).sequences(), static_cast<uint64_t>(sequences));
  EXPECT_GE(st.devices(0).sequences(), 2u);
  EXPECT_GE(st.devices(1).sequences(), 2u);
  EXPECT_EQ(st.devices(0).pages_in_use() + st.devices(1).pages_in_use(), st.pages_in_use());
  v1::InfoResponse info;
  two->Info(&info);
  ASSERT_EQ(info.devices_size(), 2);
  EXPECT_EQ(info.devices(0).capacity_pages() + info.devices(1).capacity_pages(), info.capacity_pages());
  // Attend (plain, then with decode steps that add pages) bit-equal.
  for (bool step : {false, true, true}) {
    const v1::AttendRequest req = Batch(sequences, step);
    v1::AttendResponse a, b;
    ASSERT_TRUE(one->Attend(req, &a).ok());
    ASSERT_TRUE(two->Attend(req, &b).ok());
    ASSERT_EQ(a.results_size(), b.results_size());
    for (int i = 0; i < a.results_size(); ++i) {
      EXPECT_EQ(a.results(i).output(), b.results(i).output()) << "item " << i;
      ASSERT_EQ(a.results(i).lse_size(), b.results(i).lse_size());
      for (int h = 0; h < a.results(i).lse_size(); ++h) {
        const float x = a.results(i).lse(h), y = b.results(i).lse(h);
        EXPECT_EQ(std::memcmp(&x, &y, 4), 0) << "item " << i;
      }
    }
  }
  // A sequence stays on its device: releasing one frees pages of one
  // device only.
  two->Stats(&st);
  const uint64_t before0 = st.devices(0).pages_in_use();
  const uint64_t before1 = st.devices(1).pages_in_use();
  v1::ReleaseRequest rel;
  rel.set_sequence_id("s3");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(two->Release(rel, &rr).ok());
  ASSERT_GT(rr.pages_freed(), 0u);
  two->Stats(&st);
  const uint64_t freed0 = before0 - st.devices(0).pages_in_use(), freed1 = before1 - st.devices(1).pages_in_use();
  EXPECT_TRUE((freed0 == rr.pages_freed() && freed1 == 0) || (freed1 == rr.pages_freed() && freed0 == 0))
      << freed0 << " " << freed1;
}

// Records the pages each device is asked to upload.
class UploadRecorder : public Backend {
 public:
  explicit UploadRecorder(std::vector<PageId>* uploaded) : uploaded_(uploaded) {}
  std::string name() const override { return "recorder"; }
  absl::Status EncodePages(absl::Span<EncodeJob>) override { return absl::OkStatus(); }
  absl::Status DecodeTokens(PageId, int, int, int, float*, float*) override { return absl::OkStatus(); }
  void Attend(absl::Span<AttendJob>) override {}
  absl::Status UploadPages(absl::Span<const PageId> pages) override {
    uploaded_->insert(uploaded_->end(), pages.begin(), pages.end());
    return absl::OkStatus();
  }

 private:
  std::vector<PageId>* uploaded_;
};

// A snapshot's restored pages reach the device that holds each.
TEST(MultiDeviceTest, RestoredPagesAreUploadedToTheirOwnDevice) {
  Metrics m;
  std::unique_ptr<Handler> h = Make(&m, {0, 1});
  ASSERT_NE(h, nullptr);
  const PagePool& pool = h->pool();
  ASSERT_EQ(pool.partitions(), 2);
  std::vector<PageId> got0, got1;
  std::vector<std::unique_ptr<Backend>> inner;
  inner.push_back(std::make_unique<UploadRecorder>(&got0));
  inner.push_back(std::make_unique<UploadRecorder>(&got1));
  std::unique_ptr<Backend> multi = MakeMultiDeviceBackend(std::move(inner), &pool);
  const PageId a = pool.partition_begin(0), b = pool.partition_begin(1);
  const std::vector<PageId> pages = {a, a + 1, b, b + 2, a + 3};
  ASSERT_TRUE(multi->UploadPages(pages).ok());
  EXPECT_EQ(got0, (std::vector<PageId>{a, a + 1, a + 3}));
  EXPECT_EQ(got1, (std::vector<PageId>{b, b + 2}));
}

TEST(MultiDeviceTest, FullDeviceRefusesAsAWhole) {
  Metrics m;
  // A tiny pool: 2 devices of a few pages each.
  std::unique_ptr<Handler> h = Make(&m, {0, 1}, 8 * 9000);
  ASSERT_NE(h, nullptr);
  v1::InfoResponse info;
  h->Info(&info);
  const int pages0 = static_cast<int>(info.devices(0).capacity_pages());
  const int pages1 = static_cast<int>(info.devices(1).capacity_pages());
  // One sequence fills one device; the next goes to the other device and
  // needs one page more than a device has, although the pool has room.
  absl::Status st = Append(*h, "big", 0, 32 * pages0 + 32, 1);
  EXPECT_TRUE(st.ok()) << st;
  st = Append(*h, "bigger", 0, 32 * (pages1 + 1) + 32, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("device slot"), std::string::npos) << st;
  v1::StatsResponse s;
  h->Stats(&s);
  EXPECT_EQ(s.sequences(), 1u);
}

}  // namespace
}  // namespace driftkv
