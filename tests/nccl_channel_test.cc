// The NCCL ingest channels' state machine (service/channels.h) over the
// fake transport, CPU backend: the same tokens through Append and through
// a channel give identical stores; deadline, dead peer, framing errors,
// busy channels, the channel limit and each tenant's, idle close, version
// mismatch; rejected chunks leave the pool unchanged and the channel usable.
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/channels.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"
#include "transport/fake_transport.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::SmallOptions;
using testing::SyntheticKv;

class ChannelTest : public testing::HandlerFixture {
 protected:
  ChannelTest() : HandlerFixture(testing::FixtureClock::kReal) {}

  void Make(ServiceOptions o = SmallOptions()) {
    o.nccl_chunk_timeout_seconds = 0.2;
    channels_.reset();
    HandlerFixture::Make(o);
    if (HasFatalFailure()) return;
    channels_ = std::make_unique<ChannelManager>(h_.get(), &factory_);
  }
  int n() const { return h_->codec().n(); }

  uint64_t Open(const std::string& peer, const std::string& tenant = "") {
    v1::OpenChannelRequest r;
    r.set_nccl_unique_id(peer);
    r.set_nccl_version(factory_.version());
    v1::OpenChannelResponse resp;
    absl::Status st = channels_->Open(r, &resp, tenant);
    EXPECT_TRUE(st.ok()) << st;
    return resp.channel_id();
  }

  v1::PushChunkRequest Header(uint64_t channel, const std::string& seq, uint32_t layer, uint64_t first,
                              uint32_t count) {
    v1::PushChunkRequest h;
    h.set_channel_id(channel);
    h.set_sequence_id(seq);
    h.set_layer(layer);
    h.set_first_token(first);
    h.set_token_count(count);
    h.set_dtype(v1::DTYPE_BF16);
    h.set_tensor_bytes(static_cast<uint64_t>(count) * n() * 2);
    return h;
  }

  // Tokens [first, first + count) of `kv` as bf16 wire bytes.
  std::string Bytes(const std::vector<float>& x, uint64_t first, uint32_t count) {
    std::string out;
    FloatToTensor(x.data() + first * n(), static_cast<size_t>(count) * n(), v1::DTYPE_BF16, &out);
    return out;
  }

  // Queues the peer's send of tokens [first, first + count), then pushes.
  absl::Status Push(const std::string& peer, uint64_t channel, const std::string& seq, uint32_t layer, uint64_t first,
                    uint32_t count, const testing::Kv& kv, v1::AppendResponse* r, const std::string& tenant = "",
                    bool new_incarnation = false) {
    factory_.link(peer)->QueueSend({Bytes(kv.keys, first, count), Bytes(kv.values, first, count)});
    v1::PushChunkRequest h = Header(channel, seq, layer, first, count);
    h.set_new_incarnation(new_incarnation);
    return channels_->Push(h, absl::InfiniteFuture(), r, tenant);
  }

  absl::Status Append(const std::string& seq, uint32_t layer, uint64_t first, uint32_t count, const testing::Kv& kv,
                      v1::AppendResponse* r) {
    return h_->Append(testing::ChunkOf(seq, layer, first, count, kv, v1::DTYPE_BF16), r);
  }

  std::string ReadAll(const std::string& seq, uint32_t layer) { return testing::ReadLayerBytes(*h_, seq, layer); }

  v1::StatsResponse Stats() {
    v1::StatsResponse s;
    h_->Stats(&s);
    channels_->Stats(&s);
    return s;
  }

  FakeTransportFactory factory_;
  std::unique_ptr<ChannelManager> channels_;
};

TEST_F(ChannelTest, SameStoreAsAppendAndIdempotentRepeats) {
  Make();
  const testing::Kv kv = SyntheticKv(300, 128, 7);
  const uint64_t ch = Open("peer");
  v1::AppendResponse a, b;
  // Uneven chunks: windows, pages and a page straddling two chunks.
  const uint32_t cuts[] = {0, 45, 130, 131, 300};
  for (int i = 0; i + 1 < 5; ++i) {
    ASSERT_TRUE(Append("grpc", 1, cuts[i], cuts[i + 1] - cuts[i], kv, &a).ok());
    absl::Status st = Push("peer", ch, "nccl", 1, cuts[i], cuts[i + 1] - cuts[i], kv, &b);
    ASSERT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(a.tokens_stored(), 300u);
  EXPECT_EQ(b.tokens_stored(), 300u);
  EXPECT_EQ(ReadAll("grpc", 1), ReadAll("nccl", 1));
  // A repeat (overlapping what is stored) is acknowledged, not stored again.
  const v1::StatsResponse before = Stats();
  v1::AppendResponse r;
  ASSERT_TRUE(Push("peer", ch, "nccl", 1, 250, 50, kv, &r).ok());
  EXPECT_EQ(r.tokens_stored(), 0u);
  EXPECT_EQ(r.tokens_duplicate(), 50u);
  EXPECT_EQ(Stats().pages_in_use(), before.pages_in_use());
  EXPECT_EQ(ReadAll("grpc", 1), ReadAll("nccl", 1));
  EXPECT_EQ(Stats().nccl_chunks(), 5u);
}

TEST_F(ChannelTest, GapAndBadValueRejectedChannelStaysOpen) {
  Make();
  const testing::Kv kv = SyntheticKv(200, 128, 8);
  const uint64_t ch = Open("peer");
  v1::AppendResponse r;
  ASSERT_TRUE(Push("peer", ch, "s", 0, 0, 100, kv, &r).ok());
  const v1::StatsResponse before = Stats();
  absl::Status st = Push("peer", ch, "s", 0, 150, 10, kv, &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("leaves a gap"), std::string::npos) << st;
  testing::Kv bad = kv;
  bad.values[100 * 128 + 5] = std::numeric_limits<float>::infinity();
  st = Push("peer", ch, "s", 0, 100, 50, bad, &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("values element 5 is inf"), std::string::npos) << st;
  EXPECT_EQ(Stats().pages_in_use(), before.pages_in_use());
  EXPECT_EQ(Stats().tokens_ingested(), before.tokens_ingested());
  // The same chunk through Append gets the same message.
  v1::AppendChunk c;
  c.set_sequence_id("s");
  c.set_layer(0);
  c.set_first_token(100);
  c.set_token_count(50);
  c.set_dtype(v1::DTYPE_BF16);
  *c.mutable_keys() = Bytes(bad.keys, 100, 50);
  *c.mutable_values() = Bytes(bad.values, 100, 50);
  EXPECT_EQ(h_->Append(c, &r).message(), st.message());
  // The channel is still usable.
  st = Push("peer", ch, "s", 0, 100, 100, kv, &r);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(Stats().nccl_channels_open(), 1u);
}

TEST_F(ChannelTest, DeadlineAbortsAndLeavesPoolUnchanged) {
  Make();
  const uint64_t ch = Open("slow");
  const v1::StatsResponse before = Stats();
  v1::AppendResponse r;
  const absl::Time start = absl::Now();
  // Nothing queued: the peer never sends.
  absl::Status st = channels_->Push(Header(ch, "s", 0, 0, 64), absl::InfiniteFuture(), &r);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("aborted"), std::string::npos) << st;
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(factory_.link("slow")->aborts(), 1);
  const v1::StatsResponse after = Stats();
  EXPECT_EQ(after.pages_in_use(), before.pages_in_use());
  EXPECT_EQ(after.sequences(), 0u);
  EXPECT_EQ(after.nccl_channels_open(), 0u);
  EXPECT_EQ(after.nccl_channels_aborted(), 1u);
  // The channel is gone.
  EXPECT_EQ(channels_->Push(Header(ch, "s", 0, 0, 64), absl::InfiniteFuture(), &r).code(), absl::StatusCode::kNotFound);
  // The RPC's own deadline, when sooner, bounds the wait too.
  const uint64_t ch2 = Open("slow2");
  st = channels_->Push(Header(ch2, "s", 0, 0, 64), absl::Now() + absl::Milliseconds(20), &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
}

TEST_F(ChannelTest, PeerThatNeverJoinsOrDiesAborts) {
  Make();
  factory_.link("absent")->SetJoins(false);
  const uint64_t ch = Open("absent");
  v1::AppendResponse r;
  absl::Status st = channels_->Push(Header(ch, "s", 0, 0, 64), absl::InfiniteFuture(), &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("did not join"), std::string::npos) << st;

  const testing::Kv kv = SyntheticKv(64, 128, 9);
  const uint64_t ch2 = Open("dies");
  factory_.link("dies")->FailNextRecv();
  st = Push("dies", ch2, "s", 0, 0, 64, kv, &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(factory_.link("dies")->aborts(), 1);
  EXPECT_EQ(Stats().pages_in_use(), 0u);
  EXPECT_EQ(Stats().nccl_channels_aborted(), 2u);
}

TEST_F(ChannelTest, FramingErrorsAbortTheChannel) {
  Make();
  v1::AppendResponse r;
  const uint64_t ch = Open("p");
  v1::PushChunkRequest h = Header(ch, "s", 0, 0, 10);
  h.set_tensor_bytes(h.tensor_bytes() + 2);
  absl::Status st = channels_->Push(h, absl::InfiniteFuture(), &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("tensor_bytes"), std::string::npos) << st;
  EXPECT_EQ(factory_.link("p")->aborts(), 1);
  EXPECT_EQ(factory_.link("p")->receives(), 0);

  const uint64_t ch2 = Open("q");
  h = Header(ch2, "s", 0, 0, 10);
  h.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(channels_->Push(h, absl::InfiniteFuture(), &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Stats().nccl_channels_open(), 0u);
}

TEST_F(ChannelTest, SecondChunkWhileOneIsInFlightAbortsTheChannel) {
  ServiceOptions o = SmallOptions();
  Make(o);
  const uint64_t ch = Open("busy");
  absl::Status first;
  std::thread t([&] {
    v1::AppendResponse r;
    first = channels_->Push(Header(ch, "s", 0, 0, 64), absl::Now() + absl::Seconds(5), &r);
  });
  absl::SleepFor(absl::Milliseconds(50));  // the first chunk is waiting for its data
  v1::AppendResponse r;
  absl::Status second = channels_->Push(Header(ch, "s", 0, 64, 64), absl::InfiniteFuture(), &r);
  t.join();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_NE(second.message().find("in flight"), std::string::npos) << second;
  EXPECT_FALSE(first.ok());
  EXPECT_EQ(factory_.link("busy")->aborts(), 1);
  EXPECT_EQ(Stats().pages_in_use(), 0u);
  EXPECT_EQ(Stats().nccl_channels_open(), 0u);
}

TEST_F(ChannelTest, LimitVersionIdleAndClose) {
  ServiceOptions o = SmallOptions();
  o.nccl_max_channels = 2;
  o.nccl_idle_seconds = 0.05;
  Make(o);
  const uint64_t a = Open("a");
  Open("b");
  v1::OpenChannelRequest req;
  req.set_nccl_unique_id("c");
  req.set_nccl_version(factory_.version());
  v1::OpenChannelResponse resp;
  absl::Status st = channels_->Open(req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("nccl_max_channels is 2"), std::string::npos) << st;
  v1::CloseChannelRequest close;
  close.set_channel_id(a);
  v1::CloseChannelResponse closed;
  ASSERT_TRUE(channels_->Close(close, &closed).ok());
  EXPECT_EQ(channels_->Close(close, &closed).code(), absl::StatusCode::kNotFound);
  req.set_nccl_version(factory_.version() + 1);
  st = channels_->Open(req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("same libnccl"), std::string::npos) << st;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(channels_->CloseIdle(), 1);
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.nccl_channels_open(), 0u);
  EXPECT_EQ(s.nccl_channels_idle_closed(), 1u);
  EXPECT_EQ(s.nccl_channels_opened(), 2u);
}

// With tokens no tenant may hold every channel: by default each gets
// nccl_max_channels divided among the tokens file's tenants, and a token
// line may set its own.
TEST_F(ChannelTest, OneTenantCannotHoldEveryChannel) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("channels", "nccl_max_channels: 4", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  Make(*o);
  auto open = [&](const std::string& peer, const std::string& tenant) {
    v1::OpenChannelRequest r;
    r.set_nccl_unique_id(peer);
    r.set_nccl_version(factory_.version());
    v1::OpenChannelResponse resp;
    return channels_->Open(r, &resp, tenant);
  };
  ASSERT_TRUE(open("a1", "alice").ok());
  ASSERT_TRUE(open("a2", "alice").ok());
  absl::Status st = open("a3", "alice");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("tenant \"alice\" quota max_nccl_channels 2: it holds 2 open channels and this call "
                              "needs 1 more"),
            std::string::npos)
      << st;
  EXPECT_TRUE(open("b1", "bob").ok());
  EXPECT_TRUE(open("b2", "bob").ok());
  // A closed channel gives its tenant room again.
  v1::CloseChannelRequest close;
  close.set_channel_id(1);
  v1::CloseChannelResponse closed;
  ASSERT_TRUE(channels_->Close(close, &closed, "alice").ok());
  EXPECT_TRUE(open("a4", "alice").ok());

  // A token line sets its tenant's own cap; the others share.
  o = testing::TenantOptions("channels-lines", "nccl_max_channels: 4", {"alice max_nccl_channels=3", "bob", "carol"});
  ASSERT_TRUE(o.ok()) << o.status();
  Make(*o);
  for (const char* peer : {"x1", "x2", "x3"}) EXPECT_TRUE(open(peer, "alice").ok()) << peer;
  EXPECT_EQ(open("x4", "alice").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(open("y1", "bob").ok());
  EXPECT_EQ(open("y2", "bob").code(), absl::StatusCode::kResourceExhausted);  // 4 / 3 tenants: 1
}

TEST_F(ChannelTest, NoTransportIsUnimplemented) {
  Make();
  ChannelManager none(h_.get(), nullptr);
  v1::OpenChannelRequest req;
  v1::OpenChannelResponse resp;
  EXPECT_EQ(none.Open(req, &resp).code(), absl::StatusCode::kUnimplemented);
}

// Tokens sent again with other data are refused, whether they are still in
// the window (compared exactly) or already in pages encoded from a host
// Append (compared by digest); nothing changes.
TEST_F(ChannelTest, RepeatWithOtherDataIsRejectedAndChangesNothing) {
  Make();
  const testing::Kv kv = SyntheticKv(300, 128, 7);
  const testing::Kv other = SyntheticKv(300, 128, 8);
  v1::AppendResponse r;
  ASSERT_TRUE(Append("s", 0, 0, 300, kv, &r).ok());
  const uint64_t ch = Open("peer");
  const std::string stored = ReadAll("s", 0);
  const v1::StatsResponse before = Stats();
  for (uint64_t first : {250u, 10u}) {  // window, then paged tokens
    absl::Status st = Push("peer", ch, "s", 0, first, 40, other, &r);
    EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
    EXPECT_NE(st.message().find("differ from the stored tokens"), std::string::npos) << st;
  }
  EXPECT_EQ(ReadAll("s", 0), stored);
  EXPECT_EQ(Stats().pages_in_use(), before.pages_in_use());
  // The same data again is acknowledged; the channel stayed open.
  v1::AppendResponse same;
  ASSERT_TRUE(Push("peer", ch, "s", 0, 250, 50, kv, &same).ok());
  EXPECT_EQ(same.tokens_duplicate(), 50u);
}

// A channel is its opener's: another tenant cannot push into it, its chunks
// land in the opener's namespace, and a released id is tombstoned for
// channels as for Append.
TEST_F(ChannelTest, ChannelsBelongToTheirTenantAndMeetTombstones) {
  Make();
  const testing::Kv kv = SyntheticKv(200, 128, 3);
  const uint64_t ch = Open("peer", "alice");
  v1::AppendResponse r;
  absl::Status st = Push("peer", ch, "s", 0, 0, 100, kv, &r, "mallory");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  ASSERT_TRUE(Push("peer", ch, "s", 0, 0, 100, kv, &r, "alice").ok());
  v1::LengthRequest lr;
  lr.set_sequence_id("s");
  v1::LengthResponse len;
  EXPECT_EQ(h_->Length(lr, &len, "").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(h_->Length(lr, &len, "alice").ok());
  EXPECT_EQ(len.layers(0).tokens(), 100u);
  v1::ReleaseRequest rel;
  rel.set_sequence_id("s");
  v1::ReleaseResponse released;
  ASSERT_TRUE(h_->Release(rel, &released, "alice").ok());
  st = Push("peer", ch, "s", 0, 0, 100, kv, &r, "alice");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  st = Push("peer", ch, "s", 0, 0, 100, kv, &r, "alice", /*new_incarnation=*/true);
  EXPECT_TRUE(st.ok()) << st;
}

}  // namespace
}  // namespace driftkv
