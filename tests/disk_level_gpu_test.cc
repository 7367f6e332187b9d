// The disk level under the CUDA backend's pool (service/spill_tier.h,
// docs/tiers.md): a pool of a few sequences' pages and a disk budget hold
// many sequences; every sequence brought back from the disk is uploaded to
// the device before it is served, so each Read and each Attend (cold, and
// with a hot tier promoting what came back) equals that of a CUDA handler
// that never moved a page, bit for bit; Attend with verify_pages_on_attend
// checks the device's copies of the restored pages. Skipped without a GPU.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "service/handler.h"
#include "tests/disk_test_util.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::FixtureClock;
using testing::Kv;
using testing::TestHandler;

constexpr int kLayers = 2, kKvHeads = 2, kD = 128, kN = kKvHeads * kD, kQHeads = 4, kP = 128;
constexpr int kTokens = 700;  // per layer: 4 pages of 128 and a window

ServiceOptions Options(uint64_t pool_bytes, bool hot, const std::string& disk_dir) {
  ServiceOptions o = testing::SmallOptions(pool_bytes);
  o.backend = "cuda";
  o.layers = kLayers;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kP;
  o.window_tokens = kP;
  o.max_sequences = 1024;
  o.verify_pages_on_attend = true;
  if (hot) o.hot_tier_bytes = 8 * MakeLevelPageLayout(kKvHeads, kD)->page_bytes;
  if (!disk_dir.empty()) {
    o.disk_level.dir = disk_dir;
    o.disk_level.budget_bytes = 64u << 20;
    o.disk_level.segment_bytes = 1u << 20;
  }
  return o;
}

std::string Id(int i) {
  return absl::StrCat("s", i);
}

absl::Status Add(TestHandler& t, int i) {
  const Kv kv = testing::SyntheticKv(kTokens, kN, 3000 + i);
  v1::AppendResponse r;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int at = 0; at < kTokens; at += 200) {
      const int c = std::min(200, kTokens - at);
      const size_t off = static_cast<size_t>(at) * kN;
      absl::Status st =
          t.h->Append(testing::ChunkOfRows(Id(i), l, at, c, kv.keys.data() + off, kv.values.data() + off, kN), &r);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

// Both layers read back, then attended: the bytes of each answer.
std::string Answers(TestHandler& t, int i) {
  std::string all;
  for (uint32_t l = 0; l < kLayers; ++l) all += t.Read(Id(i), l);
  v1::AttendRequest req;
  for (uint32_t l = 0; l < kLayers; ++l) {
    *req.add_items() = testing::QueryItem(Id(i), l, testing::SyntheticQuery(kQHeads, kD, 11 + i + l), kQHeads);
  }
  v1::AttendResponse resp;
  absl::Status st = t.h->Attend(req, &resp);
  if (!st.ok()) return st.ToString();
  for (const v1::AttendResult& r : resp.results()) {
    all += r.output();
    all.append(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * 4);
  }
  return all;
}

TEST(DiskLevelGpu, RestoredPagesReachTheDeviceBeforeTheyAreServed) {
  SKIP_WITHOUT_GPU();
  for (bool hot : {false, true}) {
    SCOPED_TRACE(hot ? "hot tier" : "cold");
    // A pool of three sequences' pages (8 each: 4 a layer), 24 sequences.
    uint64_t stride = 0;
    {
      TestHandler probe(Options(1u << 20, false, ""));
      ASSERT_NE(probe.h, nullptr);
      stride = probe.h->pool().page_stride();
    }
    TestHandler disk(Options(3 * 8 * stride, hot, tiers::testing::ScratchDir(hot ? "gpu_hot" : "gpu_cold")),
                     FixtureClock::kReal);
    TestHandler never_moved(Options(256u << 20, hot, ""));
    ASSERT_NE(disk.h, nullptr);
    ASSERT_NE(never_moved.h, nullptr);
    constexpr int kSequences = 24;
    for (int i = 0; i < kSequences; ++i) {
      ASSERT_TRUE(Add(disk, i).ok()) << i;
      ASSERT_TRUE(Add(never_moved, i).ok()) << i;
    }
    ASSERT_NE(disk.h->spill_tier(), nullptr);
    EXPECT_GT(disk.h->spill_tier()->sequences_below(), kSequences / 2);
    // Oldest first, then newest first: each brings its sequence back (and
    // moves others down), twice over.
    for (int i = 0; i < kSequences; ++i) EXPECT_TRUE(Answers(disk, i) == Answers(never_moved, i)) << "sequence " << i;
    for (int i = kSequences - 1; i >= 0; --i) {
      EXPECT_TRUE(Answers(disk, i) == Answers(never_moved, i)) << "sequence " << i << ", second pass";
    }
  }
}

}  // namespace
}  // namespace driftkv
