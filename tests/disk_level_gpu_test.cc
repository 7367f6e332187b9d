// The levels below the CUDA backend's pool (service/spill_tier.h,
// docs/tiers.md): a pool of a few sequences' pages over the disk level, the
// host-memory level, or both, holds many sequences; every sequence brought
// back reaches the device (a disk read uploaded; a host slot copied by the
// device itself, host mirror included) and is checked there before it is
// served, so each Read and each Attend (cold, and with a hot tier promoting
// what came back) equals that of a CUDA handler that never moved a page,
// bit for bit; Attend with verify_pages_on_attend checks the device's
// copies of the restored pages. A host slot corrupted in memory is
// DATA_LOSS for its sequence only. Skipped without a GPU.
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

ServiceOptions Options(uint64_t pool_bytes, bool hot, const std::string& disk_dir, uint64_t host_bytes = 0) {
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
  o.host_level.budget_bytes = host_bytes;
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

// A sequence's pages: 4 a layer.
constexpr int kSequencePages = 4 * kLayers;

uint64_t PageStride() {
  TestHandler probe(Options(1u << 20, false, ""));
  return probe.h == nullptr ? 0 : probe.h->pool().page_stride();
}

TEST(DiskLevelGpu, RestoredPagesReachTheDeviceBeforeTheyAreServed) {
  SKIP_WITHOUT_GPU();
  const uint64_t stride = PageStride();
  ASSERT_GT(stride, 0u);
  // Below a pool of three sequences: the disk; host memory for all of
  // them; host memory for four over the disk.
  struct Levels {
    const char* name;
    bool disk;
    uint64_t host_sequences;
  };
  for (const Levels& levels : {Levels{"disk", true, 0}, Levels{"host", false, 32}, Levels{"host_disk", true, 4}}) {
    for (bool hot : {false, true}) {
      SCOPED_TRACE(absl::StrCat(levels.name, hot ? ", hot tier" : ", cold"));
      const std::string dir =
          levels.disk ? tiers::testing::ScratchDir(absl::StrCat("gpu_", levels.name, hot ? "_hot" : "_cold")) : "";
      TestHandler moved(Options(3 * kSequencePages * stride, hot, dir, levels.host_sequences * kSequencePages * stride),
                        FixtureClock::kReal);
      TestHandler never_moved(Options(256u << 20, hot, ""));
      ASSERT_NE(moved.h, nullptr);
      ASSERT_NE(never_moved.h, nullptr);
      constexpr int kSequences = 24;
      for (int i = 0; i < kSequences; ++i) {
        ASSERT_TRUE(Add(moved, i).ok()) << i;
        ASSERT_TRUE(Add(never_moved, i).ok()) << i;
      }
      ASSERT_NE(moved.h->spill_tier(), nullptr);
      EXPECT_GT(moved.h->spill_tier()->sequences_below(), kSequences / 2);
      if (levels.host_sequences > 0) {
        EXPECT_GT(moved.h->spill_tier()->sequences_on_host(), 0);
      }
      // Oldest first, then newest first: each brings its sequence back (and
      // moves others down), twice over.
      for (int i = 0; i < kSequences; ++i) {
        EXPECT_TRUE(Answers(moved, i) == Answers(never_moved, i)) << "sequence " << i;
      }
      for (int i = kSequences - 1; i >= 0; --i) {
        EXPECT_TRUE(Answers(moved, i) == Answers(never_moved, i)) << "sequence " << i << ", second pass";
      }
    }
  }
}

TEST(DiskLevelGpu, CorruptHostSlotIsDataLossForItsSequenceOnly) {
  SKIP_WITHOUT_GPU();
  const uint64_t stride = PageStride();
  TestHandler moved(Options(3 * kSequencePages * stride, false, "", 16 * kSequencePages * stride), FixtureClock::kReal);
  TestHandler never_moved(Options(256u << 20, false, ""));
  ASSERT_NE(moved.h, nullptr);
  constexpr int kSequences = 8;
  for (int i = 0; i < kSequences; ++i) {
    ASSERT_TRUE(Add(moved, i).ok()) << i;
    ASSERT_TRUE(Add(never_moved, i).ok()) << i;
  }
  ASSERT_GT(moved.h->spill_tier()->sequences_on_host(), 0);
  // s0 went down first, into the first slots (copied there by the device).
  moved.h->spill_tier()->host_store()->slot(1)[333] ^= 0x01;
  v1::PrefetchRequest p;
  p.set_sequence_id(Id(0));
  v1::PrefetchResponse pr;
  const absl::Status st = moved.h->Prefetch(p, &pr);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("layer 0 page 1"), std::string::npos) << st;
  for (int i = 1; i < kSequences; ++i) EXPECT_TRUE(Answers(moved, i) == Answers(never_moved, i)) << "sequence " << i;
}

}  // namespace
}  // namespace driftkv
