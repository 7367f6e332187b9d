// Doorbells (service/doorbell.h, wire/doorbell.h): first ServeDoorbellRequest
// alone on plain memory with guard bytes around it and a fake AttendFn
// (every refusal lands in the response area, nothing is written outside
// the doorbell); then a real in-process server with two tenants through
// client/doorbell.h (answers bit-identical to the unary Attend, the server
// sleeping and waking, OpenDoorbell's refusals, the per-tenant limit,
// CloseDoorbell, a doorbell stopping with its region, a dead client's
// doorbell going once its lease ran out).
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/doorbell.h"
#include "client/regions.h"
#include "gtest/gtest.h"
#include "service/doorbell.h"
#include "tests/bell_memory.h"
#include "tests/tenant_server.h"
#include "wire/doorbell.h"

namespace driftkv {
namespace {

using C = absl::StatusCode;
using doorbell::ClientLine;
using doorbell::ServerLine;
using testing_bell::BellMemory;
using testing_bell::ExpectAnswered;
using testing_bell::SmallRequest;

TEST(ServeDoorbellRequestTest, AnswersWhatTheAttendFnAnswers) {
  BellMemory m(256, 256);
  m.answer.add_results()->set_output(std::string(100, 'o'));
  m.answer.mutable_results(0)->add_lse(1.5f);
  m.answer.mutable_results(0)->set_tokens(77);
  const v1::AttendRequest request = SmallRequest();
  m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()));
  m.Serve();
  ExpectAnswered(m, C::kOk);
  EXPECT_EQ(m.calls, 1);
  EXPECT_EQ(m.seen.SerializeAsString(), request.SerializeAsString());
  EXPECT_EQ(m.seen_tenant, "alice");
  v1::AttendResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(m.Response()));
  EXPECT_EQ(parsed.SerializeAsString(), m.answer.SerializeAsString());
  // A second request through the same memory.
  m.answer.mutable_results(0)->set_tokens(78);
  m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()));
  m.Serve();
  ExpectAnswered(m, C::kOk);
  ASSERT_TRUE(parsed.ParseFromString(m.Response()));
  EXPECT_EQ(parsed.results(0).tokens(), 78u);
  // A deadline still ahead is no obstacle.
  m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()), MonotonicNs() + 10'000'000'000);
  m.Serve();
  ExpectAnswered(m, C::kOk);
  EXPECT_EQ(m.calls, 3);
}

TEST(ServeDoorbellRequestTest, RequestBytesPastTheCapacityAreRefused) {
  BellMemory m(128, 256);
  m.Request(SmallRequest().SerializeAsString(), 129);
  m.Serve();
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.Response(), "doorbell request_bytes 129 exceeds its request capacity 128");
  m.Request("", 0xFFFFFFFFu);
  m.Serve();
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.calls, 0);
}

TEST(ServeDoorbellRequestTest, GarbageIsNotAnAttendRequest) {
  BellMemory m(128, 128);
  m.Request(std::string(16, '\xff'), 16);
  m.Serve();
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.Response(), "doorbell request of 16 bytes is not an AttendRequest");
  EXPECT_EQ(m.calls, 0);
}

TEST(ServeDoorbellRequestTest, ADeadlineInThePastIsNotRun) {
  BellMemory m(256, 256);
  const v1::AttendRequest request = SmallRequest();
  m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()), MonotonicNs() - 5'000'000);
  m.Serve();
  ExpectAnswered(m, C::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(m.Response(), "its deadline passed")) << m.Response();
  EXPECT_EQ(m.calls, 0);
}

TEST(ServeDoorbellRequestTest, AnyNegativeDeadlinePassedLongAgo) {
  // The client writes deadline_ns; the server must not overflow computing
  // how late the request is, whatever it holds.
  for (int64_t deadline : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(deadline);
    BellMemory m(256, 256);
    const v1::AttendRequest request = SmallRequest();
    m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()), deadline);
    const int64_t before = MonotonicNs();
    m.Serve();
    ExpectAnswered(m, C::kDeadlineExceeded);
    const std::string message = m.Response();
    ASSERT_TRUE(absl::StartsWith(message, "doorbell request 1: its deadline passed ")) << message;
    const absl::string_view late = absl::StripSuffix(
        absl::StripPrefix(message, "doorbell request 1: its deadline passed "), " us before it was read");
    uint64_t us = 0;
    ASSERT_TRUE(absl::SimpleAtoi(late, &us)) << message;
    // At least `before` - `deadline` nanoseconds late.
    EXPECT_GE(us, (static_cast<uint64_t>(before) - static_cast<uint64_t>(deadline)) / 1000);
    EXPECT_EQ(m.calls, 0);
  }
}

TEST(ServeDoorbellRequestTest, AResponseLargerThanTheCapacityIsResourceExhausted) {
  BellMemory m(256, 128);
  m.answer.add_results()->set_output(std::string(200, 'o'));
  const v1::AttendRequest request = SmallRequest();
  m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()));
  m.Serve();
  ExpectAnswered(m, C::kResourceExhausted);
  EXPECT_EQ(m.Response(),
            absl::StrCat("doorbell response of ", m.answer.ByteSizeLong(), " bytes exceeds its response capacity 128"));
  EXPECT_EQ(m.calls, 1);
}

TEST(ServeDoorbellRequestTest, AnErrorLongerThanTheResponseAreaIsCut) {
  BellMemory m(256, 64);
  m.status = absl::NotFoundError(std::string(1000, 'e'));
  const v1::AttendRequest request = SmallRequest();
  m.Request(request.SerializeAsString(), static_cast<uint32_t>(request.ByteSizeLong()));
  m.Serve();
  ExpectAnswered(m, C::kNotFound);
  EXPECT_EQ(m.Response(), std::string(64, 'e'));
}

// ---- over a real server ----

class DoorbellE2eTest : public testing::TenantServerTest {
 protected:
  static constexpr uint64_t kCapacity = 16 << 10;
  // OpenDoorbell itself (DoorbellClient::Open checks the fit first).
  absl::Status OpenRaw(Client* client, uint64_t region_id, uint64_t offset, uint64_t c, uint64_t r,
                       uint64_t* id = nullptr) {
    v1::OpenDoorbellRequest req;
    req.set_region_id(region_id);
    req.set_offset(offset);
    req.set_request_capacity(c);
    req.set_response_capacity(r);
    grpc::ClientContext context;
    v1::OpenDoorbellResponse resp;
    absl::Status st = FromGrpc(client->stub()->OpenDoorbell(&context, req, &resp));
    if (id != nullptr) *id = resp.doorbell_id();
    return st;
  }
  absl::Status CloseRaw(Client* client, uint64_t id) {
    v1::CloseDoorbellRequest req;
    req.set_doorbell_id(id);
    grpc::ClientContext context;
    v1::CloseDoorbellResponse resp;
    return FromGrpc(client->stub()->CloseDoorbell(&context, req, &resp));
  }
  std::unique_ptr<HostRegion> Region(Client* client, uint64_t bytes) {
    absl::StatusOr<std::unique_ptr<HostRegion>> r = HostRegion::Create(client, bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  // Sweeps until no doorbell is open (the bell's thread notices its region
  // went within its 50 ms futex timeout). False after 10 s.
  bool SweptToNone() {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      server_->doorbells().Sweep();
      if (server_->doorbells().open() == 0) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
};

TEST_F(DoorbellE2eTest, AnswersEqualTheUnaryAttendBitForBitThroughSleepAndWake) {
  std::unique_ptr<HostRegion> region = Region(alice_.get(), DoorbellClient::Bytes(kCapacity, kCapacity));
  ASSERT_NE(region, nullptr);
  absl::StatusOr<std::unique_ptr<DoorbellClient>> bell =
      DoorbellClient::Open(alice_.get(), region.get(), 0, kCapacity, kCapacity);
  ASSERT_TRUE(bell.ok()) << bell.status();
  EXPECT_EQ(server_->doorbells().open(), 1);
  constexpr int kDistinct = 8;
  std::vector<v1::AttendRequest> requests;
  std::vector<std::string> unary;
  for (uint32_t i = 0; i < kDistinct; ++i) {
    requests.push_back(Request(i));
    absl::StatusOr<v1::AttendResponse> u = alice_->Attend(requests.back());
    ASSERT_TRUE(u.ok()) << u.status();
    unary.push_back(u->SerializeAsString());
  }
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<v1::AttendResponse> r = (*bell)->Attend(requests[i % kDistinct], absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    ASSERT_EQ(r->SerializeAsString(), unary[i % kDistinct]) << i;
  }
  // Pauses longer than the server's spin: it goes to sleep on the futex,
  // and a request wakes it.
  const auto* server_line = reinterpret_cast<const ServerLine*>(static_cast<uint8_t*>(region->data()) + 64);
  for (int i = 0; i < 20; ++i) {
    // It spins kSpinTime (200 us) after an answer, then sleeps; it leaves
    // the futex for a moment every 50 ms to look at its region.
    const absl::Time give_up = absl::Now() + absl::Seconds(2);
    absl::SleepFor(absl::Milliseconds(2));
    while (__atomic_load_n(&server_line->server_sleeping, __ATOMIC_SEQ_CST) != 1 && absl::Now() < give_up) {
      absl::SleepFor(absl::Microseconds(100));
    }
    EXPECT_EQ(__atomic_load_n(&server_line->server_sleeping, __ATOMIC_SEQ_CST), 1u) << i;
    absl::StatusOr<v1::AttendResponse> r = (*bell)->Attend(requests[i % kDistinct], absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_EQ(r->SerializeAsString(), unary[i % kDistinct]) << i;
  }
  // An error is the unary one's, and the doorbell goes on.
  absl::StatusOr<v1::AttendResponse> unknown = (*bell)->Attend(Request(1, "nope"));
  EXPECT_EQ(unknown.status(), alice_->Attend(Request(1, "nope")).status());
  absl::StatusOr<v1::AttendResponse> r = (*bell)->Attend(requests[0]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->SerializeAsString(), unary[0]);
  EXPECT_TRUE((*bell)->Close().ok());
  EXPECT_EQ(server_->doorbells().open(), 0);
}

TEST_F(DoorbellE2eTest, OpenDoorbellRefusesWhatDoesNotFit) {
  std::unique_ptr<HostRegion> region = Region(alice_.get(), 8192);
  ASSERT_NE(region, nullptr);
  const uint64_t id = region->id();
  EXPECT_EQ(OpenRaw(alice_.get(), id, 32, 64, 64).code(), C::kInvalidArgument);
  EXPECT_EQ(OpenRaw(alice_.get(), id, 32, 64, 64).message(), "offset 32 is not a multiple of 64");
  for (uint64_t bad : {uint64_t{0}, uint64_t{100}, doorbell::kMaxAreaBytes + 64, ~uint64_t{0} - 63}) {
    SCOPED_TRACE(bad);
    absl::Status st = OpenRaw(alice_.get(), id, 0, bad, 64);
    EXPECT_EQ(st.code(), C::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(st.message(), absl::StrCat("request_capacity ", bad))) << st;
    st = OpenRaw(alice_.get(), id, 0, 64, bad);
    EXPECT_EQ(st.code(), C::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(st.message(), absl::StrCat("response_capacity ", bad))) << st;
  }
  // 128 + 4096 + 4096 > 8192; and past the end; and an offset near 2^64.
  EXPECT_EQ(OpenRaw(alice_.get(), id, 0, 4096, 4096).code(), C::kOutOfRange);
  EXPECT_EQ(OpenRaw(alice_.get(), id, 8192, 64, 64).code(), C::kOutOfRange);
  EXPECT_EQ(OpenRaw(alice_.get(), id, ~uint64_t{0} - 63, 64, 64).code(), C::kOutOfRange);
  EXPECT_TRUE(OpenRaw(alice_.get(), id, 8192 - 256, 64, 64).ok());  // exactly fits
  // Bob: alice's region is one he never heard of.
  const absl::Status foreign = OpenRaw(bob_.get(), id, 0, 64, 64);
  const absl::Status unknown = OpenRaw(bob_.get(), id ^ 0x4000, 0, 64, 64);
  EXPECT_EQ(foreign.code(), C::kNotFound);
  EXPECT_EQ(unknown.code(), C::kNotFound);
  EXPECT_EQ(foreign.message(), absl::StrCat("doorbell.region_id ", id, " not found"));
  EXPECT_EQ(unknown.message(), absl::StrCat("doorbell.region_id ", id ^ 0x4000, " not found"));
  EXPECT_EQ(server_->doorbells().open(), 1);
  // A device region would be refused (INVALID_ARGUMENT): not testable
  // without a GPU.
}

TEST_F(DoorbellE2eTest, EachTenantOpensAtMostItsLimitAndClosesOnlyItsOwn) {
  constexpr uint64_t kEach = doorbell::Bytes(64, 64);
  std::unique_ptr<HostRegion> region = Region(alice_.get(), 8192);
  static_assert(kEach * (kMaxDoorbellsPerTenant + 1) <= 8192, "room for one more than the limit");
  std::unique_ptr<HostRegion> bobs = Region(bob_.get(), 4096);
  ASSERT_NE(region, nullptr);
  ASSERT_NE(bobs, nullptr);
  std::vector<uint64_t> ids(kMaxDoorbellsPerTenant);
  for (int i = 0; i < kMaxDoorbellsPerTenant; ++i) {
    ASSERT_TRUE(OpenRaw(alice_.get(), region->id(), kEach * i, 64, 64, &ids[i]).ok()) << i;
  }
  const absl::Status over = OpenRaw(alice_.get(), region->id(), kEach * kMaxDoorbellsPerTenant, 64, 64);
  EXPECT_EQ(over.code(), C::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.message(), absl::StrCat(kMaxDoorbellsPerTenant, " of the tenant"))) << over;
  // Another tenant has its own allowance.
  uint64_t bob_id = 0;
  ASSERT_TRUE(OpenRaw(bob_.get(), bobs->id(), 0, 64, 64, &bob_id).ok());
  // Closing: unknown ids and other tenants' doorbells are NOT_FOUND alike.
  const absl::Status foreign = CloseRaw(bob_.get(), ids[0]);
  EXPECT_EQ(foreign.code(), C::kNotFound);
  EXPECT_EQ(foreign.message(), absl::StrCat("doorbell_id ", ids[0], " not found"));
  EXPECT_EQ(CloseRaw(alice_.get(), 987654321).code(), C::kNotFound);
  EXPECT_EQ(CloseRaw(alice_.get(), bob_id).code(), C::kNotFound);
  EXPECT_EQ(server_->doorbells().open(), kMaxDoorbellsPerTenant + 1);
  // One closed: room for one more; closed twice: NOT_FOUND.
  EXPECT_TRUE(CloseRaw(alice_.get(), ids[3]).ok());
  EXPECT_EQ(CloseRaw(alice_.get(), ids[3]).code(), C::kNotFound);
  EXPECT_TRUE(OpenRaw(alice_.get(), region->id(), kEach * kMaxDoorbellsPerTenant, 64, 64).ok());
  EXPECT_EQ(server_->doorbells().open(), kMaxDoorbellsPerTenant + 1);
}

TEST_F(DoorbellE2eTest, UnregisteringTheRegionStopsItsDoorbell) {
  std::unique_ptr<HostRegion> region = Region(alice_.get(), DoorbellClient::Bytes(kCapacity, kCapacity));
  ASSERT_NE(region, nullptr);
  absl::StatusOr<std::unique_ptr<DoorbellClient>> bell =
      DoorbellClient::Open(alice_.get(), region.get(), 0, kCapacity, kCapacity);
  ASSERT_TRUE(bell.ok()) << bell.status();
  ASSERT_TRUE((*bell)->Attend(Request(0), absl::Seconds(5)).ok());
  ASSERT_TRUE(region->Unregister().ok());
  // Nobody answers any more: the client gives up a second past the deadline.
  absl::StatusOr<v1::AttendResponse> r = (*bell)->Attend(Request(0), absl::Milliseconds(100));
  EXPECT_EQ(r.status().code(), C::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no answer through doorbell")) << r.status();
  EXPECT_TRUE(SweptToNone());
  EXPECT_EQ((*bell)->Close().code(), C::kNotFound);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(DoorbellE2eTest, AClientThatDiesLeavesNothingAfterItsLease) {
  const std::string helper =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/tests/doorbell_client_helper");
  const std::string out = testing::TestDir() + "/doorbell-helper.out";
  const std::string cmd = absl::StrCat(helper, " 127.0.0.1:", server_->port(), " ", *dir_, "/ca.pem ",
                                       testing::kAliceToken, " 1 driftkv-dead-bell > ", out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  uint64_t id = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadAll(out)), &id)) << ReadAll(out);
  // The process is gone; its doorbell is still open and its memory mapped.
  EXPECT_EQ(server_->doorbells().open(), 1);
  EXPECT_TRUE(absl::StrContains(ReadAll("/proc/self/maps"), "memfd:driftkv-dead-bell"));
  // The lease (1 s) runs out, the reaper drops the region, the doorbell
  // stops and is swept, and the last mapping goes with it.
  EXPECT_TRUE(SweptToNone());
  EXPECT_EQ(alice_->Stats()->tenant_regions(), 0u);
  EXPECT_FALSE(absl::StrContains(ReadAll("/proc/self/maps"), "memfd:driftkv-dead-bell"));
  EXPECT_EQ(CloseRaw(alice_.get(), id).code(), C::kNotFound);
}

}  // namespace
}  // namespace driftkv
