// A hot layer's new pages encoded straight into level pages
// (Backend::EncodeLevelPages) against encoding them cold and promoting:
// the same level pages byte for byte, the same checksums of the cold and
// the level form, the same statistics; on the CPU backend (which packs
// the encoder's symbols) and through Backend's default (encode, promote).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/page_checksum.h"
#include "codec/dquant_kv_codec.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

constexpr int kHeads = 2, kD = 64, kN = kHeads * kD, kP = 128, kPages = 3;

// Forwards what the default EncodeLevelPages composes to a real backend,
// and nothing else: Backend's own EncodeLevelPages runs.
class Composing : public Backend {
 public:
  explicit Composing(Backend* inner) : inner_(inner) {}
  std::string name() const override { return "composing"; }
  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override { return inner_->EncodePages(jobs); }
  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeTokens(page, layer, first, count, keys, values);
  }
  void Attend(absl::Span<AttendJob> jobs) override { inner_->Attend(jobs); }
  bool SupportsHotTier() const override { return inner_->SupportsHotTier(); }
  absl::Status PromotePages(absl::Span<const TierMove> moves) override { return inner_->PromotePages(moves); }

 private:
  Backend* inner_;
};

struct Fixture {
  Fixture() {
    DQuantConfig c;
    c.kv_heads = kHeads;
    c.head_dim = kD;
    codec = std::make_unique<DQuantCodec>(*DQuantCodec::Create(c));
    level = *MakeLevelPageLayout(*codec);
    pool = *PagePool::Create(codec->page_layout(), 4 * kPages * codec->page_layout().page_bytes);
    hot = *PagePool::CreateOpaque(level.page_bytes, kLevelPageTokens, 4 * kPages * level.page_bytes);
    kv_codec = std::make_unique<DQuantKvCodec>(*codec);
    BackendArgs args;
    args.codec = kv_codec.get();
    args.pool = pool.get();
    args.threads = 2;
    args.hot_pool = hot.get();
    cpu = *MakeCpuBackend(args);
    kv = testing::SyntheticKv(kPages * kP, kN, 21);
  }
  std::vector<EncodeJob> Jobs(const std::vector<PageId>& cold) const {
    std::vector<EncodeJob> jobs(cold.size());
    for (size_t i = 0; i < cold.size(); ++i) {
      jobs[i].keys = kv.keys.data() + i * kP * kN;
      jobs[i].values = kv.values.data() + i * kP * kN;
      jobs[i].page = cold[i];
    }
    return jobs;
  }
  std::unique_ptr<DQuantCodec> codec;
  LevelPageLayout level;
  std::unique_ptr<PagePool> pool, hot;
  std::unique_ptr<DQuantKvCodec> kv_codec;
  std::unique_ptr<Backend> cpu;
  testing::Kv kv;
};

// Encodes the fixture's pages cold and promotes them: the reference.
struct Reference {
  std::vector<PageId> hot;
  std::vector<PageChecksum> cold_sums, hot_sums;
  std::vector<EncodeJob> jobs;
};

Reference EncodeThenPromote(Fixture& f) {
  Reference r;
  const std::vector<PageId> cold = *f.pool->Reserve(kPages);
  r.hot = *f.hot->Reserve(kPages);
  r.jobs = f.Jobs(cold);
  EXPECT_TRUE(f.cpu->EncodePages(absl::MakeSpan(r.jobs)).ok());
  std::vector<TierMove> moves;
  for (int i = 0; i < kPages; ++i) moves.push_back(TierMove{cold[i], r.hot[i], kP});
  r.cold_sums.resize(kPages);
  r.hot_sums.resize(kPages);
  EXPECT_TRUE(f.cpu->PromotePagesChecked(moves, *f.pool, *f.hot, r.cold_sums.data(), r.hot_sums.data()).ok());
  return r;
}

void CheckStraight(Fixture& f, Backend* backend, const Reference& want) {
  const std::vector<PageId> cold = *f.pool->Reserve(kPages), hot = *f.hot->Reserve(kPages);
  for (PageId p : hot) std::memset(f.hot->page(p), 0xa5, f.level.page_bytes);  // no stale bytes pass
  std::vector<EncodeJob> jobs = f.Jobs(cold);
  std::vector<PageChecksum> cold_sums(kPages), hot_sums(kPages);
  absl::Status st =
      backend->EncodeLevelPages(absl::MakeSpan(jobs), hot, *f.pool, *f.hot, cold_sums.data(), hot_sums.data());
  ASSERT_TRUE(st.ok()) << st;
  for (int i = 0; i < kPages; ++i) {
    SCOPED_TRACE(::testing::Message() << "page " << i);
    EXPECT_EQ(0, std::memcmp(f.hot->page(hot[i]), f.hot->page(want.hot[i]), f.level.page_bytes));
    EXPECT_EQ(cold_sums[i], want.cold_sums[i]);
    EXPECT_EQ(hot_sums[i], want.hot_sums[i]);
    EXPECT_EQ(hot_sums[i], Crc32c(f.hot->page(hot[i]), f.hot->page_stride()));
    EXPECT_EQ(jobs[i].stats.keys.bytes_used, want.jobs[i].stats.keys.bytes_used);
    EXPECT_EQ(jobs[i].stats.values.moved, want.jobs[i].stats.values.moved);
    EXPECT_EQ(jobs[i].key_utilization, want.jobs[i].key_utilization);
  }
  f.pool->Free(cold);
  f.hot->Free(hot);
}

TEST(EncodeLevelPages, CpuBackendEqualsEncodeThenPromote) {
  Fixture f;
  const Reference want = EncodeThenPromote(f);
  CheckStraight(f, f.cpu.get(), want);
}

TEST(EncodeLevelPages, DefaultEqualsEncodeThenPromote) {
  Fixture f;
  const Reference want = EncodeThenPromote(f);
  Composing composing(f.cpu.get());
  CheckStraight(f, &composing, want);
}

TEST(EncodeLevelPages, BadTokensAreTheEncodersError) {
  Fixture f;
  const std::vector<PageId> cold = *f.pool->Reserve(1), hot = *f.hot->Reserve(1);
  std::vector<float> values(f.kv.values.begin(), f.kv.values.begin() + kP * kN);
  values[5 * kN + 3] = 1e9f;  // beyond the fp16 range of the container
  std::vector<EncodeJob> jobs = f.Jobs(cold);
  jobs[0].values = values.data();
  PageChecksum c = 0, h = 0;
  absl::Status st = f.cpu->EncodeLevelPages(absl::MakeSpan(jobs), hot, *f.pool, *f.hot, &c, &h);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("value of token 5"), std::string::npos) << st;
}

}  // namespace
}  // namespace driftkv
