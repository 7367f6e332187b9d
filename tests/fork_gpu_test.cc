// Handler::Fork on the CUDA backend (docs/prefix_cache.md): a fork that is
// appended the rest of its tokens answers exactly what a sequence given all
// of them answers (Read bytes, Attend output and lse bit for bit), in the
// cold and the hot tier, and its tokens read back as the CPU backend's do;
// a warm restart brings back forks sharing pages, the prefix index and a
// pin on the device (each page uploaded once) answering as before.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::TestHandler;

constexpr int kLayers = 2, kKvHeads = 2, kD = 128, kN = kKvHeads * kD, kQHeads = 4, kP = 128;

ServiceOptions Options(const char* backend, bool hot) {
  ServiceOptions o = testing::SmallOptions(16u << 20);
  o.backend = backend;
  o.layers = kLayers;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kP;
  o.window_tokens = kP;
  if (hot) o.hot_tier_bytes = 64 * MakeLevelPageLayout(kKvHeads, kD)->page_bytes;
  return o;
}

absl::Status Push(TestHandler& t, const std::string& seq, const Kv& kv, int first, int count) {
  v1::AppendResponse r;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int at = first; at < first + count; at += 200) {
      const int c = std::min(200, first + count - at);
      const size_t off = static_cast<size_t>(at) * kN;
      absl::Status st =
          t.h->Append(testing::ChunkOfRows(seq, l, at, c, kv.keys.data() + off, kv.values.data() + off, kN), &r);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

// Each layer's tokens as Read returns them, then each layer's Attend answer.
std::string Answers(TestHandler& t, const std::string& seq) {
  std::string all;
  for (uint32_t l = 0; l < kLayers; ++l) all += t.Read(seq, l);
  for (uint32_t l = 0; l < kLayers; ++l) {
    v1::AttendRequest req;
    *req.add_items() = testing::QueryItem(seq, l, testing::SyntheticQuery(kQHeads, kD, 7 + l), kQHeads);
    v1::AttendResponse resp;
    absl::Status st = t.h->Attend(req, &resp);
    if (!st.ok()) return st.ToString();
    const v1::AttendResult& r = resp.results(0);
    all += r.output();
    all.append(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * 4);
  }
  return all;
}

TEST(ForkGpu, AppendingTheRestEqualsAFreshSequenceInBothTiers) {
  SKIP_WITHOUT_GPU();
  for (bool hot : {false, true}) {
    SCOPED_TRACE(hot ? "hot" : "cold");
    TestHandler cuda(Options("cuda", hot)), cpu(Options("cpu", hot));
    ASSERT_NE(cuda.h, nullptr);
    ASSERT_NE(cpu.h, nullptr);
    const Kv kv = testing::SyntheticKv(1000, kN, 3), other = testing::SyntheticKv(1000, kN, 4);
    Kv want = other;
    std::copy(kv.keys.begin(), kv.keys.begin() + 384 * kN, want.keys.begin());
    std::copy(kv.values.begin(), kv.values.begin() + 384 * kN, want.values.begin());
    for (TestHandler* t : {&cuda, &cpu}) {
      ASSERT_TRUE(Push(*t, "src", kv, 0, 700).ok());
      Answers(*t, "src");  // promotes, with a hot tier
      v1::ForkRequest fork;
      fork.set_source_sequence_id("src");
      fork.set_sequence_id("f");
      fork.set_tokens(384);
      v1::ForkResponse resp;
      absl::Status st = t->h->Fork(fork, &resp, "");
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_TRUE(Push(*t, "f", want, 384, 616).ok());
      ASSERT_TRUE(Push(*t, "whole", want, 0, 1000).ok());
    }
    EXPECT_EQ(cuda.h->LayerIsHot("f", 0), hot);
    EXPECT_EQ(Answers(cuda, "f"), Answers(cuda, "whole"));
    for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(cuda.Read("f", l), cpu.Read("f", l)) << l;
  }
}

// With verify_pages_on_attend the CUDA backend checks the device's copy of
// every page an Attend reads (Backend::ChecksumPages downloads it) against
// the checksums recorded at encoding (cold) and at promotion (hot): intact
// pages pass in both tiers, through a fork and its source, and nothing is
// counted as a failure.
TEST(ForkGpu, VerifiedAttendsPassOnTheDevicesCopyInBothTiers) {
  SKIP_WITHOUT_GPU();
  for (bool hot : {false, true}) {
    SCOPED_TRACE(hot ? "hot" : "cold");
    ServiceOptions o = Options("cuda", hot);
    o.verify_pages_on_attend = true;
    TestHandler cuda(o);
    ASSERT_NE(cuda.h, nullptr);
    const Kv kv = testing::SyntheticKv(700, kN, 5);
    ASSERT_TRUE(Push(cuda, "src", kv, 0, 700).ok());
    const std::string first = Answers(cuda, "src");  // promotes, with a hot tier
    EXPECT_EQ(Answers(cuda, "src"), first);
    v1::ForkRequest fork;
    fork.set_source_sequence_id("src");
    fork.set_sequence_id("f");
    fork.set_tokens(256);
    v1::ForkResponse resp;
    ASSERT_TRUE(cuda.h->Fork(fork, &resp, "").ok());
    ASSERT_TRUE(Push(cuda, "f", kv, 256, 444).ok());
    EXPECT_EQ(Answers(cuda, "f"), first);
    EXPECT_EQ(cuda.h->LayerIsHot("src", 1), hot);
    EXPECT_EQ(cuda.Stats().checksum_failures(), 0u);
  }
}

// A warm restart on the CUDA backend: a source and its fork sharing pages
// (hot before the drain), a prompt only the prefix index holds and a pin
// come back with their pages uploaded to the device once each; the forks
// answer bit for bit as before, a fork from the prefix as one made before
// the restart, and the pool holds each page of the file once.
TEST(ForkGpu, SharedPagesTheIndexAndPinsRestoreOnTheDevice) {
  SKIP_WITHOUT_GPU();
  const std::string dir = ::testing::TempDir() + "/fork-gpu-snapshot";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Kv kv = testing::SyntheticKv(1000, kN, 21), prompt = testing::SyntheticKv(600, kN, 22);
  std::vector<uint32_t> ids(600);
  for (int i = 0; i < 600; ++i) ids[i] = 500 + 7 * i;
  auto fork_prefix = [&](TestHandler& t, const std::string& seq) {
    v1::ForkRequest req;
    req.set_sequence_id(seq);
    req.mutable_prefix_token_ids()->Add(ids.begin(), ids.end());
    v1::ForkResponse resp;
    absl::Status st = t.h->Fork(req, &resp, "");
    return st.ok() ? Answers(t, seq) : st.ToString();
  };
  std::string src, f, from_prefix;
  uint64_t pinned_pages = 0;
  Handler::SnapshotSummary written, loaded;
  {
    TestHandler t(Options("cuda", true));
    ASSERT_NE(t.h, nullptr);
    ASSERT_TRUE(Push(t, "src", kv, 0, 700).ok());
    Answers(t, "src");  // promotes
    v1::ForkRequest fork;
    fork.set_source_sequence_id("src");
    fork.set_sequence_id("f");
    fork.set_tokens(512);
    v1::ForkResponse resp;
    ASSERT_TRUE(t.h->Fork(fork, &resp, "").ok());
    for (uint32_t l = 0; l < kLayers; ++l) {
      v1::AppendChunk c = testing::ChunkOfRows("sys", l, 0, 600, prompt.keys.data(), prompt.values.data(), kN);
      c.mutable_token_ids()->Add(ids.begin(), ids.end());
      v1::AppendResponse r;
      ASSERT_TRUE(t.h->Append(c, &r).ok());
    }
    v1::PinRequest pin;
    pin.set_pin_id("sys");
    pin.mutable_prefix_token_ids()->Add(ids.begin(), ids.end());
    pin.set_ttl_seconds(600);
    v1::PinResponse pinned;
    ASSERT_TRUE(t.h->Pin(pin, &pinned).ok());
    pinned_pages = pinned.pages_pinned();
    v1::ReleaseRequest rel;
    rel.set_sequence_id("sys");
    v1::ReleaseResponse rr;
    ASSERT_TRUE(t.h->Release(rel, &rr).ok());
    src = Answers(t, "src");
    f = Answers(t, "f");
    from_prefix = fork_prefix(t, "user");
    rel.set_sequence_id("user");
    ASSERT_TRUE(t.h->Release(rel, &rr).ok());
    ASSERT_TRUE(t.h->WriteSnapshot(dir, &written).ok());
  }
  EXPECT_GT(written.shared_pages, 0u);
  EXPECT_GT(written.index_entries, 0u);
  EXPECT_EQ(written.pins, 1u);
  TestHandler t(Options("cuda", true));
  ASSERT_NE(t.h, nullptr);
  ASSERT_TRUE(t.h->LoadSnapshot(dir, &loaded).ok());
  EXPECT_EQ(loaded.sequences, 2u);
  EXPECT_EQ(loaded.index_entries, written.index_entries);
  EXPECT_EQ(loaded.pins, 1u);
  // Every full page of the file restored once (hot layers come back cold,
  // and both layers of this test hold the same data: equal pages repeat).
  EXPECT_EQ(t.Stats().pages_in_use(), written.pages + written.index_entries + pinned_pages - written.shared_pages);
  EXPECT_TRUE(Answers(t, "src") == src);
  EXPECT_TRUE(Answers(t, "f") == f);
  EXPECT_TRUE(fork_prefix(t, "user-2") == from_prefix);
}

}  // namespace
}  // namespace driftkv
