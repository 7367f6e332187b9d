// The polling door for Attend (config attend_poll_threads, service/
// attend_poller.h; client option poll_attend): over loopback gRPC, CPU
// backend, its answers equal the sleeping door's bit for bit (inline f32
// and bf16 outputs, decode steps, batched, alone and from 8 clients at
// once), its errors are the same statuses, a request that does not parse
// is INVALID_ARGUMENT, a shutdown with calls in flight ends them cleanly
// (also one still being served when the poller stops), and the config
// names its bad values. With DRIFTKV_ATTEND_TRACE, each call's times are
// written out in order when the server goes.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/driftkv.grpc.pb.h"
#include "service/attend_poller.h"
#include "service/call_trace.h"
#include "service/server.h"
#include "tests/loopback_server.h"
#include "tests/service_test_util.h"
#include "wire/monotonic.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::QueryItem;
using testing::SyntheticKv;
using testing::SyntheticQuery;

constexpr int kN = testing::kSmallN, kD = 64, kQHeads = 4, kSequences = 6, kTokens = 150;

using Door = testing::InlineDoor;

// Items over `first`..`first + count` sequences, layer 1, outputs in
// `dtype`; with `step`, each item's decode step at its sequence's end.
v1::AttendRequest Request(int first, int count, v1::DType dtype, const testing::Kv& kv, int step) {
  v1::AttendRequest req;
  for (int s = first; s < first + count; ++s) {
    v1::AttendItem* it = req.add_items();
    *it = QueryItem(absl::StrCat("s", s), 1, SyntheticQuery(kQHeads, kD, 30 + s), kQHeads);
    it->set_output_dtype(dtype);
    if (step >= 0) {
      const int pos = kTokens - 10 * s + step;
      FloatToTensor(kv.keys.data() + pos * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
      FloatToTensor(kv.values.data() + pos * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
      it->set_new_token_index(pos);
    }
  }
  return req;
}

// Every result's bytes (output, lse, tokens), in order.
std::string Bytes(const absl::StatusOr<v1::AttendResponse>& r) {
  if (!r.ok()) return r.status().ToString();
  std::string all;
  for (const v1::AttendResult& x : r->results()) {
    all += x.output();
    all.append(reinterpret_cast<const char*>(x.lse().data()), x.lse_size() * sizeof(float));
    all += absl::StrCat("|", x.tokens(), "|");
  }
  return all;
}

// One Attend of raw bytes (not necessarily an AttendRequest) through a
// generic stub, started at construction.
class RawAttendCall {
 public:
  RawAttendCall(const std::string& target, const std::string& bytes, int deadline_s)
      : stub_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    call_ = stub_.PrepareUnaryCall(&ctx_, "/driftkv.v1.KvCache/Attend", request, &cq_);
    call_->StartCall();
    call_->Finish(&response_, &status_, reinterpret_cast<void*>(1));
  }
  ~RawAttendCall() {
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  // Waits for the call's end; false if the queue ended first.
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    return cq_.Next(&tag, &ok);
  }
  const grpc::Status& status() const { return status_; }

 private:
  grpc::GenericStub stub_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer response_;
  grpc::Status status_;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call_;
};

TEST(AttendPoller, AnswersEqualTheSleepingDoorBitForBit) {
  const testing::Kv kv = SyntheticKv(kTokens + 20, kN, 3);
  Door sleeping(false), polling(true);
  sleeping.Fill(kv, kSequences, kTokens);
  polling.Fill(kv, kSequences, kTokens);
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    // Batched, then each item alone.
    const v1::AttendRequest all = Request(0, kSequences, dtype, kv, -1);
    const std::string want = Bytes(sleeping.client->Attend(all));
    EXPECT_TRUE(Bytes(polling.client->Attend(all)) == want);
    std::string alone;
    for (int s = 0; s < kSequences; ++s) alone += Bytes(polling.client->Attend(Request(s, 1, dtype, kv, -1)));
    EXPECT_TRUE(alone == want);
  }
  // Decode steps: each appends a token and attends it, on both doors.
  for (int step = 0; step < 3; ++step) {
    const v1::AttendRequest req = Request(0, kSequences, v1::DTYPE_BF16, kv, step);
    EXPECT_TRUE(Bytes(polling.client->Attend(req)) == Bytes(sleeping.client->Attend(req))) << "step " << step;
  }
}

TEST(AttendPoller, EightClientsAtOnceGetTheAnswersOfOne) {
  const testing::Kv kv = SyntheticKv(kTokens, kN, 4);
  Door polling(true);
  polling.Fill(kv, kSequences, kTokens);
  std::vector<std::string> want(kSequences);
  for (int s = 0; s < kSequences; ++s) {
    want[s] = Bytes(polling.client->Attend(Request(s, 1, v1::DTYPE_F32, kv, -1)));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      Client c(polling.client->options());
      for (int i = 0; i < 25; ++i) {
        const int s = (t + i) % kSequences;
        if (Bytes(c.Attend(Request(s, 1, v1::DTYPE_F32, kv, -1))) != want[s]) ++wrong;
      }
    });
  }
  for (std::thread& c : clients) c.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(AttendPoller, ErrorsAreTheSleepingDoorsAndGarbageIsInvalidArgument) {
  const testing::Kv kv = SyntheticKv(kTokens, kN, 5);
  Door sleeping(false), polling(true);
  sleeping.Fill(kv, kSequences, kTokens);
  polling.Fill(kv, kSequences, kTokens);
  v1::AttendRequest unknown = Request(0, 1, v1::DTYPE_F32, kv, -1);
  unknown.mutable_items(0)->set_sequence_id("nope");
  v1::AttendRequest bad_layer = Request(0, 1, v1::DTYPE_F32, kv, -1);
  bad_layer.mutable_items(0)->set_layer(9);
  for (const v1::AttendRequest& req : {unknown, bad_layer, v1::AttendRequest()}) {
    const absl::Status want = sleeping.client->Attend(req).status();
    EXPECT_FALSE(want.ok());
    EXPECT_EQ(polling.client->Attend(req).status(), want);
  }
  // Bytes that are no AttendRequest.
  {
    RawAttendCall call(testing::LoopbackTarget(polling.server->port()), std::string("\xff\xff\xff\xff", 4), 10);
    ASSERT_TRUE(call.Wait());
    EXPECT_EQ(call.status().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(call.status().error_message(), "the request is not an AttendRequest");
  }
  // The door still serves.
  EXPECT_TRUE(polling.client->Attend(Request(0, 1, v1::DTYPE_F32, kv, -1)).ok());
}

TEST(AttendPoller, ShutdownWithCallsInFlightEndsThem) {
  const testing::Kv kv = SyntheticKv(kTokens, kN, 6);
  for (int round = 0; round < 3; ++round) {
    Door polling(true);
    polling.Fill(kv, kSequences, kTokens);
    std::atomic<bool> stop{false};
    std::atomic<int> answered{0}, unexpected{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 4; ++t) {
      clients.emplace_back([&] {
        ClientOptions co = polling.client->options();
        co.max_attempts = 1;
        Client c(co);
        while (!stop.load()) {
          absl::StatusOr<v1::AttendResponse> r = c.Attend(Request(0, kSequences, v1::DTYPE_F32, kv, -1));
          if (r.ok()) {
            ++answered;
          } else if (r.status().code() != absl::StatusCode::kUnavailable &&
                     r.status().code() != absl::StatusCode::kCancelled) {
            ++unexpected;
          }
        }
      });
    }
    while (answered.load() < 20) std::this_thread::yield();
    polling.server->Shutdown(absl::Milliseconds(200 * round));
    stop.store(true);
    for (std::thread& c : clients) c.join();
    EXPECT_EQ(unexpected.load(), 0);
  }
}

// A call still being served when the server's Shutdown has cancelled it
// and the poller is stopped: the poller must neither ask the shut-down
// queue for the next call nor answer on it (gRPC aborts the process on
// either), and the client sees the call end.
TEST(AttendPoller, StopWhileServingDropsTheCall) {
  v1::KvCache::WithRawMethod_Attend<v1::KvCache::Service> service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  queues.push_back(builder.AddCompletionQueue());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  absl::Notification entered, server_down;
  std::atomic<int> served{0};
  AttendPoller poller(
      std::move(queues), absl::Microseconds(50),
      [&service](grpc::ServerContext* context, grpc::ByteBuffer* request,
                 grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                 void* tag) { service.RequestAttend(context, request, writer, cq, cq, tag); },
      [&](grpc::ServerContext*, grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
        entered.Notify();
        // Past the server's Shutdown (if gRPC lets it return first), and
        // long enough for Stop to have shut the queue down.
        if (server_down.WaitForNotificationWithTimeout(absl::Seconds(10))) absl::SleepFor(absl::Milliseconds(200));
        ++served;
        *response = *request;
        return grpc::Status::OK;
      });
  poller.Start();

  RawAttendCall call(absl::StrCat("127.0.0.1:", port), "bytes", 20);
  entered.WaitForNotification();

  server->Shutdown(std::chrono::system_clock::now());
  server_down.Notify();
  poller.Stop();
  EXPECT_EQ(served.load(), 1);
  ASSERT_TRUE(call.Wait());
  EXPECT_NE(call.status().error_code(), grpc::StatusCode::OK) << "the call was cut by the shutdown";
}

TEST(AttendPoller, TraceWritesEachCallsTimesInOrder) {
  const std::string path = ::testing::TempDir() + "/attend_trace.csv";
  std::remove(path.c_str());
  const testing::Kv kv = SyntheticKv(kTokens + 20, kN, 3);
  const int64_t before = MonotonicNs();
  {
    ::setenv("DRIFTKV_ATTEND_TRACE", path.c_str(), 1);
    Door polling(true);  // the poller reads the variable when it is built
    ::unsetenv("DRIFTKV_ATTEND_TRACE");
    polling.Fill(kv, kSequences, kTokens);  // Append: not through the door
    for (int s = 0; s < 5; ++s) {
      ASSERT_TRUE(polling.client->Attend(Request(s, 1, v1::DTYPE_BF16, kv, -1)).ok());
    }
  }
  const int64_t after = MonotonicNs();
  std::ifstream f(path);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  EXPECT_EQ(line, "arrived_ns,served_ns,finished_ns,phases_ns");
  // Rows are written as sends complete, which another poller thread may
  // see before this one: sorted by arrival, each call must arrive after
  // the one before was served (its answer was built before it was sent).
  std::vector<std::array<long long, 4>> rows;
  while (std::getline(f, line)) {
    std::array<long long, 4> r{};
    ASSERT_EQ(std::sscanf(line.c_str(), "%lld,%lld,%lld,%lld", &r[0], &r[1], &r[2], &r[3]), 4) << line;
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end());
  int calls = 0;
  int64_t last_served = before;
  for (const auto& [a, b, c, phases] : rows) {
    EXPECT_LE(last_served, a) << a;  // one call at a time, in order
    EXPECT_LE(a, b) << a;
    EXPECT_LE(b, c) << a;
    EXPECT_LE(c, after) << a;
    // The call's phases (parse and Handler) lie inside its serving.
    EXPECT_GT(phases, 0) << a;
    EXPECT_LE(phases, b - a) << a;
    last_served = b;
    ++calls;
  }
  EXPECT_EQ(calls, 5);
}

TEST(AttendPoller, ConfigNamesBadValues) {
  struct Case {
    std::string text, message;
  };
  for (const Case& c : std::vector<Case>{
           {"attend_poll_threads: 65", "attend_poll_threads 65 out of range [0, 64]"},
           {"attend_poll_spin_us: 1000001", "attend_poll_spin_us 1000001 out of range [0, 1000000]"},
           {"grpc_read_chunk_bytes: 100",
            "grpc_read_chunk_bytes 100 out of range [4096, 67108864] (or 0: gRPC's "
            "default)"},
       }) {
    v1::ServerConfig config;
    config.mutable_model()->set_layers(2);
    config.mutable_model()->set_kv_heads(2);
    config.mutable_model()->set_head_dim(64);
    config.set_pool_bytes(8 << 20);
    ASSERT_TRUE(google::protobuf::TextFormat::MergeFromString(c.text, &config)) << c.text;
    absl::StatusOr<ServiceOptions> o = ResolveConfig(config);
    EXPECT_EQ(o.status(), absl::InvalidArgumentError(c.message));
  }
}

}  // namespace
}  // namespace driftkv
