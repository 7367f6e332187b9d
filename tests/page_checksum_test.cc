// The page checksum (backends/page_checksum.h) and its checks in the
// handler: CRC-32C test vectors; a flipped bit in a stored cold page makes
// Read answer DATA_LOSS naming the page, layer and sequence (Attend too
// with verify_pages_on_attend, and the failure is counted), and nothing
// else is affected; a hot page whose demoted form differs is refused.
#include "backends/page_checksum.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

TEST(Crc32c, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32c(reinterpret_cast<const uint8_t*>(digits.data()), digits.size()), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, ContinuesAcrossSplitsAtEveryOffset) {
  std::vector<uint8_t> data(1031);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut = 0; cut <= data.size(); cut += 13) {
    EXPECT_EQ(Crc32c(data.data() + cut, data.size() - cut, Crc32c(data.data(), cut)), whole) << cut;
  }
}

class ChecksumHandlerTest : public testing::HandlerFixture {
 protected:
  ChecksumHandlerTest() : HandlerFixture(testing::FixtureClock::kReal) {}

  void Make(bool verify_attend) {
    ServiceOptions o = testing::SmallOptions();
    o.verify_pages_on_attend = verify_attend;
    HandlerFixture::Make(o);
    if (HasFatalFailure()) return;
    // 100 tokens: pages of 32 and a window of 32 make 2 pages (ids 0 and 1).
    testing::Kv kv = testing::SyntheticKv(100, 128, 5);
    v1::AppendResponse r;
    ASSERT_TRUE(h_->Append(testing::ChunkOf("seq", 1, 0, 100, kv), &r).ok());
    ASSERT_EQ(h_->pool().pages_in_use(), 2);
  }
  absl::Status Read() {
    v1::ReadRequest r;
    r.set_sequence_id("seq");
    r.set_layer(1);
    return h_->Read(r, [](const v1::ReadChunk&) { return true; });
  }
  absl::Status Attend() {
    v1::AttendRequest a;
    *a.add_items() = testing::QueryItem("seq", 1, testing::SyntheticQuery(2, 64, 1), 2);
    v1::AttendResponse resp;
    return h_->Attend(a, &resp);
  }
  uint64_t Failures() { return Stats().checksum_failures(); }
};

TEST_F(ChecksumHandlerTest, IntactPagesReadAndAttend) {
  Make(true);
  EXPECT_TRUE(Read().ok());
  EXPECT_TRUE(Attend().ok());
  EXPECT_EQ(Failures(), 0u);
}

TEST_F(ChecksumHandlerTest, FlippedBitInAColdPageIsDataLossOnRead) {
  Make(false);
  h_->pool().page(1)[777] ^= 0x04;  // one of the two pages, whichever holds tokens [32, 64) or [0, 32)
  absl::Status st = Read();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "of layer 1 of sequence_id \"seq\" fails its checksum")) << st;
  EXPECT_EQ(Failures(), 1u);
  // Without verify_pages_on_attend Attend does not compare checksums (the
  // rANS decoder may still notice; that is not counted here).
  Attend().IgnoreError();
  EXPECT_EQ(Failures(), 1u);
  h_->pool().page(1)[777] ^= 0x04;
  EXPECT_TRUE(Read().ok());
}

TEST_F(ChecksumHandlerTest, FlippedBitIsDataLossOnAttendWhenVerifying) {
  Make(true);
  h_->pool().page(0)[h_->pool().page_stride() - 1] ^= 0x80;  // the last byte (the mean record)
  absl::Status st = Attend();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[0]: page ")) << st;
  EXPECT_EQ(Failures(), 1u);
  v1::InfoResponse info;
  h_->Info(&info);
  EXPECT_TRUE(info.verify_pages_on_attend());
}

}  // namespace
}  // namespace driftkv
