// The service over gRPC: an in-process server on a loopback port the OS
// picks, driven by driftkv::Client. Status codes over the wire, the oversize
// message limit, the health service, concurrent clients, and /metrics
// scraped over HTTP (retries of lost answers: service_grpc_retry_test.cc).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/grpc_health_v1.grpc.pb.h"
#include "tests/grpc_test_fixture.h"
#include "tests/loopback_server.h"
#include "tests/service_http.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;
using namespace grpc_test;  // NOLINT(build/namespaces)

// Real time plus an offset the test moves forward; shared with the server's
// threads, so it outlives them through the shared_ptr in AsClock.
class SkewedClock {
 public:
  void Advance(absl::Duration d) { offset_ns_->fetch_add(absl::ToInt64Nanoseconds(d)); }
  std::function<absl::Time()> AsClock() const {
    std::shared_ptr<std::atomic<int64_t>> offset = offset_ns_;
    return [offset] { return absl::Now() + absl::Nanoseconds(offset->load()); };
  }

 private:
  std::shared_ptr<std::atomic<int64_t>> offset_ns_ = std::make_shared<std::atomic<int64_t>>(0);
};

TEST_F(GrpcTest, RoundTripOfEveryMethod) {
  absl::StatusOr<v1::InfoResponse> info = client_->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->layers(), 2u);
  EXPECT_EQ(info->kv_heads(), 2u);
  EXPECT_EQ(info->head_dim(), 64u);
  EXPECT_EQ(info->page_tokens(), 32u);
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_GT(info->capacity_pages(), 0u);

  const testing::Kv kv = SyntheticKv(200, kN, 1);
  absl::StatusOr<v1::AppendResponse> a = client_->Append(Chunks("seq", 1, kv, 0, 200, 64));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->chunks(), 4u);
  EXPECT_EQ(a->tokens_stored(), 200u);

  v1::AttendRequest req;
  const std::vector<float> q = SyntheticQuery(4, kD, 2);
  *req.add_items() = QueryItem("seq", 1, q, 4);
  absl::StatusOr<v1::AttendResponse> r = client_->Attend(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->results_size(), 1);
  EXPECT_EQ(r->results(0).tokens(), 200u);
  EXPECT_EQ(r->results(0).lse_size(), 4);
  EXPECT_EQ(OutputFloats(r->results(0)).size(), 4u * kD);

  // An open stream: layer 0 chunk by chunk, as a prefill produces them.
  std::unique_ptr<Client::AppendStream> stream = client_->OpenAppend();
  for (const v1::AppendChunk& c : Chunks("seq", 0, kv, 0, 100, 30)) ASSERT_TRUE(stream->Write(c));
  absl::StatusOr<v1::AppendResponse> streamed = stream->Finish();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->chunks(), 4u);
  EXPECT_EQ(streamed->tokens_stored(), 100u);

  // Layers over concurrent calls.
  std::vector<v1::AppendChunk> both = Chunks("seq2", 0, kv, 0, 200, 50);
  for (const v1::AppendChunk& c : Chunks("seq2", 1, kv, 0, 120, 50)) both.push_back(c);
  absl::StatusOr<v1::AppendResponse> conc = client_->AppendConcurrently(both, 2);
  ASSERT_TRUE(conc.ok()) << conc.status();
  EXPECT_EQ(conc->chunks(), 7u);
  EXPECT_EQ(conc->tokens_stored(), 320u);
  ASSERT_TRUE(client_->Release("seq2").ok());

  // Read with a small chunk size: several messages, resumable.
  absl::StatusOr<Client::Tensors> t = client_->ReadFloat("seq", 1, 5, 190);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens, 190u);
  EXPECT_EQ(t->keys.size(), 190u * kN);

  absl::StatusOr<v1::ReleaseResponse> rel = client_->Release("seq");
  ASSERT_TRUE(rel.ok()) << rel.status();
  EXPECT_EQ(rel->tokens_freed(), 300u);
  absl::StatusOr<v1::StatsResponse> s = client_->Stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pages_in_use(), 0u);
  EXPECT_EQ(s->sequences(), 0u);
  EXPECT_EQ(client_->retries(), 0);
}

TEST_F(GrpcTest, StatusCodesAndMessagesCrossTheWire) {
  const testing::Kv kv = SyntheticKv(100, kN, 3);
  ASSERT_TRUE(client_->Append(Chunks("s", 0, kv, 0, 50, 50)).ok());
  const std::vector<float> q = SyntheticQuery(2, kD, 4);
  v1::AttendRequest req;
  *req.add_items() = QueryItem("ghost", 0, q, 2);
  absl::Status st = client_->Attend(req).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(st.message(), "\"ghost\" not found")) << st;
  req.mutable_items(0)->set_sequence_id("s");
  req.mutable_items(0)->set_layer(1);
  EXPECT_EQ(client_->Attend(req).status().code(), absl::StatusCode::kFailedPrecondition);
  req.mutable_items(0)->set_layer(5);
  EXPECT_EQ(client_->Attend(req).status().code(), absl::StatusCode::kInvalidArgument);
  // The second chunk of a stream has a gap: the first stays, the status says which.
  std::vector<v1::AppendChunk> chunks = Chunks("s", 0, kv, 50, 10, 10);
  std::vector<v1::AppendChunk> gap = Chunks("s", 0, kv, 70, 10, 10);
  chunks.push_back(gap[0]);
  st = client_->Append(chunks).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(st.message(), "chunk 1 of the stream (1 accepted before it)")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "first_token 70 leaves a gap")) << st;
  EXPECT_EQ(Stored(), 60u);
  EXPECT_EQ(client_->retries(), 0);  // none of these is retried
}

// After a stream whose third chunk is rejected, Length reports exactly the
// tokens of the two accepted chunks, split as the storage rule says.
TEST_F(GrpcTest, LengthAfterAPartlyFailedAppendStream) {
  const testing::Kv kv = SyntheticKv(200, kN, 31);
  std::vector<v1::AppendChunk> chunks = Chunks("p", 0, kv, 0, 200, 40);  // 5 chunks
  chunks[2].set_head_dim(32);
  chunks[2].set_kv_heads(4);
  absl::Status st = client_->Append(chunks).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(st.message(),
            "chunk 2 of the stream (2 accepted before it): kv_heads 4 does not match the server's kv_heads 2");
  absl::StatusOr<v1::LengthResponse> len = client_->Length("p");
  ASSERT_TRUE(len.ok()) << len.status();
  ASSERT_EQ(len->layers_size(), 2);
  EXPECT_EQ(len->layers(0).tokens(), 80u);
  EXPECT_EQ(len->layers(0).compressed_tokens(), 32u);  // P = R = 32: one page, 48 in the window
  EXPECT_EQ(len->layers(0).window_tokens(), 48u);
  EXPECT_EQ(len->layers(1).tokens(), 0u);
  // Resuming from the reported length stores the rest.
  chunks[2].clear_head_dim();
  chunks[2].clear_kv_heads();
  absl::StatusOr<v1::AppendResponse> a =
      client_->Append(std::vector<v1::AppendChunk>(chunks.begin() + 2, chunks.end()));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tokens_stored(), 120u);
  EXPECT_EQ(client_->Length("p")->layers(0).tokens(), 200u);
  EXPECT_EQ(client_->Length("ghost").status().code(), absl::StatusCode::kNotFound);
  // Prefetch over the wire: nothing below without a disk level; tenant-scoped lookup.
  EXPECT_EQ(client_->Prefetch("p")->pages_restored(), 0u);
  EXPECT_EQ(client_->Prefetch("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->retries(), 0);
}

TEST_F(GrpcTest, OversizeMessageIsResourceExhaustedAndServerKeepsServing) {
  ServiceOptions o = SmallOptions();
  o.max_message_bytes = 64 << 10;
  Start(o);
  const testing::Kv kv = SyntheticKv(200, kN, 5);
  // 200 tokens x 128 x 2 bytes x 2 = 100 KiB > 64 KiB.
  absl::Status st = client_->Append(Chunks("big", 0, kv, 0, 200, 200)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(Stored(), 0u);
  EXPECT_TRUE(client_->Append(Chunks("big", 0, kv, 0, 200, 50)).ok());
  EXPECT_EQ(Stored(), 200u);
}

TEST_F(GrpcTest, FullPoolOverTheWire) {
  ServiceOptions o = SmallOptions();
  o.pool_bytes = 4096;  // one page of 2880 bytes
  Start(o);
  const testing::Kv kv = SyntheticKv(200, kN, 6);
  absl::Status st = client_->Append(Chunks("p", 0, kv, 0, 200, 200)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(st.message(), "pool full: capacity 1 pages")) << st;
  EXPECT_EQ(client_->retries(), 0);
  EXPECT_EQ(Stored(), 0u);
}

// The prefix cache over the wire: chunks with token ids, a Lookup whose
// lost answer is retried, Fork from the prefix (not retried), timed as
// "Lookup" and "Fork".
TEST_F(GrpcTest, LookupAndForkFromAPrefixOverTheWire) {
  std::atomic<int> budget{1};
  ServiceOptions o = SmallOptions();
  o.metrics_listen = "127.0.0.1:0";
  StartLosingAnswers("/Lookup", &budget, o);
  const testing::Kv kv = SyntheticKv(200, kN, 16);
  std::vector<uint32_t> ids(200);
  for (int i = 0; i < 200; ++i) ids[i] = 7 * i + 3;
  std::vector<v1::AppendChunk> chunks;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (int t = 0; t < 200; t += 100) {
      chunks.push_back(MakeChunk("src", layer, t, 100, kv.keys.data() + t * kN, kv.values.data() + t * kN, kN,
                                 v1::DTYPE_BF16, absl::MakeConstSpan(ids).subspan(t, 100)));
    }
  }
  ASSERT_TRUE(client_->Append(chunks).ok());
  ASSERT_TRUE(client_->Release("src").ok());
  absl::StatusOr<v1::LookupResponse> l = client_->Lookup(ids);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(client_->retries(), 1);
  EXPECT_EQ(l->pages(), 5u);
  EXPECT_EQ(l->prompt_pages(), 6u);
  EXPECT_EQ(l->miss_reason(), v1::MISS_NEVER_STORED);
  const uint64_t pages = client_->Stats()->pages_in_use();
  absl::StatusOr<v1::ForkResponse> f = client_->ForkFromPrefix(ids, "f", 128);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tokens(), 128u);
  EXPECT_EQ(client_->Stats()->pages_in_use(), pages);
  absl::StatusOr<Client::Tensors> got = client_->ReadFloat("f", 1, 0, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tokens, 128u);
  std::vector<uint32_t> other(ids.begin(), ids.end());
  other[0] += 1;
  absl::Status st = client_->ForkFromPrefix(other, "g").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(client_->Lookup(v1::LookupRequest()).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_TRUE(absl::StrContains(metrics, "driftkv_rpc_duration_seconds_count{code=\"OK\",method=\"Lookup\"} 2"))
      << metrics;
  EXPECT_TRUE(absl::StrContains(metrics, "driftkv_prefix_index_pages 10")) << metrics;
}

// Pin and Unpin through the client, and WatchPages' stream: the pages of
// a sequence appended with ids arrive as PAGE_STORED events, then the
// client cancels the stream (CANCELLED).
TEST_F(GrpcTest, PinUnpinAndWatchPagesOverTheWire) {
  auto stub = client_->stub();
  grpc::ClientContext watch;
  std::unique_ptr<grpc::ClientReader<v1::PageEventBatch>> events = stub->WatchPages(&watch, v1::WatchPagesRequest());
  const testing::Kv kv = SyntheticKv(100, kN, 17);
  std::vector<uint32_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = 5 * i + 1;
  // The subscription is made when the server runs the call, which the
  // client does not see: give it time before the pages are stored.
  std::vector<v1::AppendChunk> chunks;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    chunks.push_back(
        MakeChunk("p", layer, 0, 100, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16, absl::MakeConstSpan(ids)));
  }
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(client_->Append(chunks).ok());
  v1::PageEventBatch batch;
  int stored = 0;
  while (stored < 4 && events->Read(&batch)) {
    for (const v1::PageEvent& e : batch.events()) stored += e.kind() == v1::PAGE_STORED ? 1 : 0;
  }
  EXPECT_EQ(stored, 4);  // 2 pages of 2 layers
  watch.TryCancel();
  EXPECT_EQ(events->Finish().error_code(), grpc::StatusCode::CANCELLED);
  absl::StatusOr<v1::PinResponse> pin = client_->Pin("sys", ids, 60);
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(pin->pages_pinned(), 4u);
  EXPECT_EQ(client_->Unpin("sys")->pages_unpinned(), 4u);
  EXPECT_EQ(client_->Unpin("sys").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(GrpcTest, HealthServiceAnswersServing) {
  auto channel = grpc::CreateChannel(testing::LoopbackTarget(server_->port()), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "driftkv.v1.KvCache"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = stub->Check(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("no.such.Service");
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_EQ(stub->Check(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

grpc::health::v1::HealthCheckResponse::ServingStatus HealthOf(int port, const std::string& service) {
  auto channel = grpc::CreateChannel(testing::LoopbackTarget(port), grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = grpc::health::v1::Health::NewStub(channel)->Check(&ctx, req, &resp);
  return st.ok() ? resp.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

// Probes may point at the health-only port: a drain must show there too,
// for every service name, or a draining pod stays Ready.
TEST_F(GrpcTest, DrainIsNotServingOnEveryHealthServiceOfBothPorts) {
  ServiceOptions o = SmallOptions();
  o.health_listen = "127.0.0.1:0";
  o.drain_notice_seconds = 3;
  o.drain_timeout_seconds = 1;
  Start(o);
  const int ports[] = {server_->port(), server_->health_port()};
  const char* services[] = {"", "driftkv.v1.KvCache"};
  using S = grpc::health::v1::HealthCheckResponse;
  for (int port : ports) {
    for (const char* service : services) ASSERT_EQ(HealthOf(port, service), S::SERVING) << port << " " << service;
  }
  Handler::SnapshotSummary summary;
  std::thread drain([&] { EXPECT_TRUE(server_->Drain(&summary).ok()); });
  // Drain sets the status before its notice period starts.
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (!server_->handler().draining() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(100));
  for (int port : ports) {
    for (const char* service : services) EXPECT_EQ(HealthOf(port, service), S::NOT_SERVING) << port << " " << service;
  }
  drain.join();
}

// grpc::Server::Shutdown waits for connections, not only calls: a client
// connected but idle must not hold a drain for its whole timeout. The idle
// client is an HTTP/2 connection that never reads again, as a Python
// channel with no call in progress behaves: it never answers the GOAWAY.
TEST_F(GrpcTest, DrainWithAnIdleConnectedClientEndsWellBeforeItsTimeout) {
  ServiceOptions o = SmallOptions();
  o.drain_notice_seconds = 0;
  o.drain_timeout_seconds = 20;
  Start(o);
  ASSERT_TRUE(client_->Info().ok());  // a connected client, then idle
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  // The client preface, then an empty SETTINGS frame (length 0, type 4).
  const std::string preface = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string("\0\0\0\4\0\0\0\0\0", 9);
  ASSERT_EQ(write(fd, preface.data(), preface.size()), static_cast<ssize_t>(preface.size()));
  absl::SleepFor(absl::Milliseconds(200));  // the server has taken the connection
  Handler::SnapshotSummary summary;
  const absl::Time start = absl::Now();
  EXPECT_TRUE(server_->Drain(&summary).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(o.drain_timeout_seconds / 4));
  close(fd);
}

TEST_F(GrpcTest, ConcurrentClientsOnOwnAndSharedSequences) {
  const int threads = 6, tokens = 130;
  const testing::Kv kv = SyntheticKv(tokens + threads * 40, kN, 11);
  const std::vector<float> q = SyntheticQuery(2, kD, 12);
  ASSERT_TRUE(client_->Append(Chunks("shared", 1, kv, 0, tokens, 64)).ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ClientOptions co = client_->options();
      Client c(co);  // one channel per thread, as separate workers would
      const std::string own = absl::StrCat("own", t);
      if (!c.Append(Chunks(own, 0, kv, 0, tokens, 33)).ok()) ++failures;
      for (int step = 0; step < 20; ++step) {
        v1::AttendRequest req;
        v1::AttendItem* it = req.add_items();
        *it = QueryItem(own, 0, q, 2);
        const int pos = tokens + step;
        FloatToTensor(kv.keys.data() + pos * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
        FloatToTensor(kv.values.data() + pos * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
        it->set_new_token_index(pos);
        *req.add_items() = QueryItem("shared", 1, q, 2);
        absl::StatusOr<v1::AttendResponse> r = c.Attend(req);
        if (!r.ok() || r->results(0).tokens() != static_cast<uint64_t>(pos + 1)) ++failures;
        if (r.ok() && r->results(1).tokens() < static_cast<uint64_t>(tokens)) ++failures;
      }
      // Everyone also appends the same tokens to the shared layer.
      if (!c.Append(Chunks("shared", 1, kv, tokens, 40, 8)).ok()) ++failures;
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(failures.load(), 0);
  absl::StatusOr<v1::StatsResponse> s = client_->Stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->sequences(), threads + 1u);
  EXPECT_EQ(s->tokens_compressed() + s->tokens_window(), static_cast<uint64_t>(threads * (tokens + 20) + tokens + 40));
}

// The client's transport options (a larger HTTP/2 window, large socket
// reads, a polled Attend) change how bytes move, not what they say: the
// same Attend answers bit for bit through each.
TEST_F(GrpcTest, TransportOptionsGiveTheSameAnswer) {
  const testing::Kv kv = SyntheticKv(300, kN, 41);
  ASSERT_TRUE(client_->Append(Chunks("t", 0, kv, 0, 300, 100)).ok());
  v1::AttendRequest req;
  *req.add_items() = QueryItem("t", 0, SyntheticQuery(2, kD, 42), 2);
  absl::StatusOr<v1::AttendResponse> want = client_->Attend(req);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    ClientOptions co = client_->options();
    if (variant == 0) co.http2_window_bytes = 16 << 20;
    if (variant == 1) co.read_chunk_bytes = 1 << 20;
    if (variant == 2) co.poll_attend = true;
    Client c(co);
    absl::StatusOr<v1::AttendResponse> got = c.Attend(req);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->SerializeAsString(), want->SerializeAsString());
  }
}

TEST_F(GrpcTest, MetricsAreScrapedOverHttpAndMove) {
  ServiceOptions o = SmallOptions();
  o.metrics_listen = "127.0.0.1:0";
  Start(o);
  ASSERT_GT(server_->metrics_port(), 0);
  const std::string before = testing::HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(absl::StrContains(before, "200 OK")) << before.substr(0, 200);
  const testing::Kv kv = SyntheticKv(300, kN, 13);
  ASSERT_TRUE(client_->Append(Chunks("m", 0, kv, 0, 300, 100)).ok());
  v1::AttendRequest req;
  *req.add_items() = QueryItem("m", 0, SyntheticQuery(2, kD, 14), 2);
  ASSERT_TRUE(client_->Attend(req).ok());
  req.mutable_items(0)->set_layer(9);
  ASSERT_FALSE(client_->Attend(req).ok());
  const std::string after = testing::HttpGet(server_->metrics_port(), "/metrics");
  // Every metric of docs/metrics.md is present.
  for (const char* name : {"driftkv_budget_utilization_ratio_bucket",
                           "driftkv_symbols_coded_total",
                           "driftkv_symbols_moved_total",
                           "driftkv_encode_retries_total",
                           "driftkv_encode_fallbacks_total",
                           "driftkv_pages_encoded_total",
                           "driftkv_pool_capacity_bytes",
                           "driftkv_pool_used_bytes",
                           "driftkv_pool_capacity_pages",
                           "driftkv_pool_used_pages",
                           "driftkv_tokens_stored",
                           "driftkv_window_bytes",
                           "driftkv_sequences",
                           "driftkv_sequences_created_total",
                           "driftkv_sequences_released_total",
                           "driftkv_sequences_expired_total",
                           "driftkv_ingested_bytes_total",
                           "driftkv_ingested_tokens_total",
                           "driftkv_duplicate_tokens_total",
                           "driftkv_rejected_requests_total",
                           "driftkv_attention_tokens_total",
                           "driftkv_attention_items_total",
                           "driftkv_attention_items_by_route_total",
                           "driftkv_attend_batch_calls_count",
                           "driftkv_attend_batch_items_count",
                           "driftkv_rpc_duration_seconds_bucket",
                           "driftkv_pages",
                           "driftkv_hot_tier_capacity_bytes",
                           "driftkv_hot_tier_capacity_pages",
                           "driftkv_hot_layers",
                           "driftkv_tier_promotions_total",
                           "driftkv_tier_promotions_skipped_total",
                           "driftkv_tier_demotions_total",
                           "driftkv_tier_pages_moved_total",
                           "driftkv_tier_pages_encoded_hot_total",
                           "driftkv_tier_cold_copies_pages",
                           "driftkv_tier_pages_demoted_from_copies_total",
                           "driftkv_tier_cold_copies_reclaimed_total",
                           "driftkv_tier_promotion_seconds_count",
                           "driftkv_tier_promotion_backend_seconds_count"}) {
    EXPECT_TRUE(absl::StrContains(after, name)) << name;
  }
  using testing::MetricValue;
  // 300 tokens, R = P = 32: 8 pages of 32 tokens x 128 symbols, per stream.
  EXPECT_EQ(MetricValue(after, "driftkv_symbols_coded_total{stream=\"key\"}"), 8 * 32 * 128);
  EXPECT_EQ(MetricValue(after, "driftkv_symbols_coded_total{stream=\"value\"}"), 8 * 32 * 128);
  EXPECT_GT(MetricValue(after, "driftkv_symbols_moved_total{stream=\"key\"}"), 0);
  // The CPU backend runs calls separately: nothing is merged or observed.
  EXPECT_EQ(MetricValue(after, "driftkv_attend_batch_calls_count"), 0);
  // One utilisation sample per encoded stream: 8 pages x 32 tokens.
  EXPECT_EQ(MetricValue(after, "driftkv_budget_utilization_ratio_count{stream=\"key\"}"), 8 * 32);
  EXPECT_EQ(MetricValue(after, "driftkv_budget_utilization_ratio_count{stream=\"value\"}"), 8 * 32);
  EXPECT_EQ(MetricValue(after, "driftkv_pool_used_pages"), 8);
  EXPECT_EQ(MetricValue(after, "driftkv_pool_used_bytes"), 8.0 * server_->handler().pool().page_stride());
  EXPECT_EQ(MetricValue(after, "driftkv_tokens_stored{form=\"compressed\"}"), 256);
  EXPECT_EQ(MetricValue(after, "driftkv_tokens_stored{form=\"bf16_window\"}"), 44);
  EXPECT_EQ(MetricValue(after, "driftkv_ingested_tokens_total"), 300);
  EXPECT_EQ(MetricValue(after, "driftkv_ingested_bytes_total"), 300.0 * kN * 2 * 2);
  EXPECT_EQ(MetricValue(after, "driftkv_attention_tokens_total"), 300);
  EXPECT_EQ(MetricValue(after, "driftkv_sequences"), 1);
  EXPECT_EQ(MetricValue(before, "driftkv_sequences"), 0);
  EXPECT_EQ(MetricValue(after, "driftkv_rejected_requests_total"), 1);  // the layer-9 Attend
  EXPECT_TRUE(
      absl::StrContains(after, "driftkv_rpc_duration_seconds_count{code=\"INVALID_ARGUMENT\",method=\"Attend\"} 1"))
      << after;
  EXPECT_TRUE(absl::StrContains(after, "driftkv_rpc_duration_seconds_count{code=\"OK\",method=\"Append\"} 1"));
}

// Server reflection (grpc.reflection.v1alpha) lists the services. Debian
// ships no stubs for it, so the test speaks it with a generic call: the
// request {list_services: ""} is field 7, a string, of length 0.
TEST_F(GrpcTest, ReflectionListsServices) {
  auto channel = grpc::CreateChannel(testing::LoopbackTarget(server_->port()), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto wait = [&cq](intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && reinterpret_cast<intptr_t>(tag) == expected && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(wait(1));
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(wait(2));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(wait(3));
  call->WritesDone(reinterpret_cast<void*>(4));
  ASSERT_TRUE(wait(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(wait(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_TRUE(absl::StrContains(bytes, "driftkv.v1.KvCache")) << bytes;
  EXPECT_TRUE(absl::StrContains(bytes, "grpc.health.v1.Health")) << bytes;
  cq.Shutdown();
}

// The server's own reaper thread releases idle sequences. Its clock moves
// only when the test says so: on a loaded machine real time could pass the
// TTL between the Append and the first check.
TEST_F(GrpcTest, TtlReaperReleasesIdleSequences) {
  ServiceOptions o = SmallOptions();
  o.ttl_seconds = 30;
  SkewedClock clock;
  ServerHooks hooks;
  hooks.clock = clock.AsClock();
  Start(o, std::move(hooks));
  const testing::Kv kv = SyntheticKv(100, kN, 15);
  ASSERT_TRUE(client_->Append(Chunks("idle", 0, kv, 0, 100, 100)).ok());
  EXPECT_EQ(client_->Stats()->sequences(), 1u);
  clock.Advance(absl::Seconds(60));
  absl::StatusOr<v1::StatsResponse> s;
  for (int i = 0; i < 100; ++i) {  // up to 10 s; the reaper runs each second
    absl::SleepFor(absl::Milliseconds(100));
    s = client_->Stats();
    if (s.ok() && s->sequences() == 0) break;
  }
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->sequences(), 0u);
  EXPECT_EQ(s->sequences_expired(), 1u);
  EXPECT_EQ(s->pages_in_use(), 0u);
  v1::AttendRequest req;
  *req.add_items() = QueryItem("idle", 0, SyntheticQuery(2, kD, 16), 2);
  EXPECT_EQ(client_->Attend(req).status().code(), absl::StatusCode::kNotFound);
}

// The hot tier over the wire: Info and Stats report it, /metrics counts
// pages per tier and promotions, answers and Reads equal those of a server
// without a hot tier, and the server's own reaper demotes an idle layer.
TEST_F(GrpcTest, HotTierOverGrpc) {
  ServiceOptions o = SmallOptions();
  o.codec.mean_window = 128;  // level pages need P = 128
  o.window_tokens = 128;
  o.metrics_listen = "127.0.0.1:0";
  ServiceOptions cold_options = o;
  o.hot_tier_bytes = 2 << 20;
  o.hot_idle_seconds = 30;
  SkewedClock clock;  // the layer idles only when the test advances it
  ServerHooks hooks;
  hooks.clock = clock.AsClock();
  Start(o, std::move(hooks));
  cold_options.metrics_listen = "";
  absl::StatusOr<std::unique_ptr<DriftkvServer>> cold_server = DriftkvServer::Start(cold_options);
  ASSERT_TRUE(cold_server.ok()) << cold_server.status();
  ClientOptions co;
  co.target = testing::LoopbackTarget((*cold_server)->port());
  Client cold(co);

  absl::StatusOr<v1::InfoResponse> info = client_->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->hot_tier());
  EXPECT_EQ(info->hot_promotion(), "sync");
  EXPECT_GT(info->hot_page_bytes(), info->page_bytes());
  EXPECT_EQ(info->hot_capacity_bytes(), info->hot_capacity_pages() * info->hot_page_bytes());
  const testing::Kv kv = SyntheticKv(700, kN, 17);  // 4 pages of 128 + a 188-token window
  ASSERT_TRUE(client_->Append(Chunks("h", 1, kv, 0, 700, 128)).ok());
  ASSERT_TRUE(cold.Append(Chunks("h", 1, kv, 0, 700, 128)).ok());
  v1::AttendRequest req;
  *req.add_items() = QueryItem("h", 1, SyntheticQuery(4, kD, 18), 4);
  absl::StatusOr<v1::AttendResponse> got = client_->Attend(req), want = cold.Attend(req);
  ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
  EXPECT_EQ(got->results(0).output(), want->results(0).output());
  for (int h = 0; h < 4; ++h) EXPECT_EQ(got->results(0).lse(h), want->results(0).lse(h));
  absl::StatusOr<v1::StatsResponse> s = client_->Stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->hot_pages_in_use(), 4u);
  EXPECT_EQ(s->pages_in_use(), 4u);  // the promoted layer's cold copies
  EXPECT_EQ(s->cold_copy_pages(), 4u);
  EXPECT_EQ(s->cold_copy_bytes(), 4u * info->page_bytes());
  EXPECT_EQ(s->promotions(), 1u);
  absl::StatusOr<Client::Tensors> read_hot = client_->ReadFloat("h", 1, 0, 0), read_cold = cold.ReadFloat("h", 1, 0, 0);
  ASSERT_TRUE(read_hot.ok() && read_cold.ok());
  EXPECT_EQ(read_hot->keys, read_cold->keys);
  EXPECT_EQ(read_hot->values, read_cold->values);
  using testing::MetricValue;
  const std::string text = testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(text, "driftkv_pages{tier=\"hot\"}"), 4);
  EXPECT_EQ(MetricValue(text, "driftkv_pages{tier=\"cold\"}"), 4);
  EXPECT_EQ(MetricValue(text, "driftkv_tier_cold_copies_pages"), 4);
  EXPECT_EQ(MetricValue(text, "driftkv_tier_promotions_total"), 1);
  EXPECT_EQ(MetricValue(text, "driftkv_tier_promotion_seconds_count"), 1);
  EXPECT_EQ(MetricValue(text, "driftkv_tier_promotion_backend_seconds_count"), 1);
  EXPECT_LE(MetricValue(text, "driftkv_tier_promotion_backend_seconds_sum"),
            MetricValue(text, "driftkv_tier_promotion_seconds_sum"));
  EXPECT_EQ(MetricValue(text, "driftkv_hot_tier_capacity_bytes"), static_cast<double>(info->hot_capacity_bytes()));
  // The server's reaper (no TTL) demotes the layer once it has idled.
  clock.Advance(absl::Seconds(60));
  for (int i = 0; i < 100 && s.ok() && s->hot_pages_in_use() > 0; ++i) {  // up to 10 s
    absl::SleepFor(absl::Milliseconds(100));
    s = client_->Stats();
  }
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->hot_pages_in_use(), 0u);
  EXPECT_EQ(s->pages_in_use(), 4u);
  EXPECT_EQ(s->demotions(), 1u);
  EXPECT_EQ(MetricValue(testing::HttpGet(server_->metrics_port(), "/metrics"),
                        "driftkv_tier_demotions_total{reason=\"idle\"}"),
            1);
  (*cold_server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace driftkv
