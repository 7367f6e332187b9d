// The standard gRPC server metrics (service/server_metrics.h) on a real
// server over loopback: every KvCache method's series exist at zero before
// the first call (all codes of grpc_server_handled_total too), and each kind
// of call moves them: unary OK and errors by code, a client stream's
// messages received, a server stream's messages sent, the latency
// histogram; driftkv_server_info names the backend and device.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/loopback_server.h"
#include "tests/service_http.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

constexpr int kN = 128;  // SmallOptions: 2 KV heads x 64

// The series of one KvCache method (labels in prometheus-cpp's sorted order).
std::string Series(const std::string& name, const std::string& method, const std::string& type,
                   const std::string& code = "") {
  std::string labels;
  if (!code.empty()) labels = absl::StrCat("grpc_code=\"", code, "\",");
  absl::StrAppend(&labels, "grpc_method=\"", method, "\",grpc_service=\"driftkv.v1.KvCache\",grpc_type=\"", type, "\"");
  return absl::StrCat(name, "{", labels, "}");
}

class ServerMetricsTest : public testing::LoopbackFixture {
 protected:
  void SetUp() override {
    ServiceOptions o = testing::SmallOptions();
    o.metrics_listen = "127.0.0.1:0";
    Start(o);
  }
  std::string Scrape() { return testing::HttpGet(server_->metrics_port(), "/metrics"); }
  double Value(const std::string& text, const std::string& series) { return testing::MetricValue(text, series); }
};

TEST_F(ServerMetricsTest, EveryMethodAndCodeStartsAtZero) {
  const std::string text = Scrape();
  for (const auto& [method, type] : std::vector<std::pair<std::string, std::string>>{{"Append", "client_stream"},
                                                                                     {"Attend", "unary"},
                                                                                     {"Read", "server_stream"},
                                                                                     {"Release", "unary"},
                                                                                     {"Info", "unary"},
                                                                                     {"Stats", "unary"}}) {
    EXPECT_EQ(Value(text, Series("grpc_server_started_total", method, type)), 0) << method;
    for (const char* code : {"OK", "Canceled", "InvalidArgument", "NotFound", "ResourceExhausted", "OutOfRange",
                             "Unavailable", "DataLoss", "Unauthenticated"}) {
      EXPECT_EQ(Value(text, Series("grpc_server_handled_total", method, type, code)), 0) << method << " " << code;
    }
    EXPECT_EQ(Value(text, Series("grpc_server_handling_seconds_count", method, type)), 0) << method;
  }
  EXPECT_TRUE(absl::StrContains(text, "driftkv_server_info{backend=\"cpu\",device=\"cpu\",version=\"0.1.0\"} 1"))
      << text;
}

TEST_F(ServerMetricsTest, CallsMoveTheirSeries) {
  ASSERT_TRUE(client_->Info().ok());
  ASSERT_TRUE(client_->Info().ok());
  // A client stream of 3 chunks.
  const testing::Kv kv = testing::SyntheticKv(96, kN, 3);
  std::vector<v1::AppendChunk> chunks;
  for (int t = 0; t < 96; t += 32) {
    chunks.push_back(MakeChunk("s", 0, t, 32, kv.keys.data() + t * kN, kv.values.data() + t * kN, kN, v1::DTYPE_BF16));
  }
  ASSERT_TRUE(client_->Append(chunks).ok());
  // A server stream of 2 messages (read_chunk_tokens 64).
  v1::ReadRequest read;
  read.set_sequence_id("s");
  absl::StatusOr<std::vector<v1::ReadChunk>> r = client_->Read(read);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  // Errors by code: NOT_FOUND and INVALID_ARGUMENT.
  EXPECT_EQ(client_->Release("ghost").status().code(), absl::StatusCode::kNotFound);
  v1::AttendRequest empty;
  EXPECT_EQ(client_->Attend(empty).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string text = Scrape();
  EXPECT_EQ(Value(text, Series("grpc_server_started_total", "Info", "unary")), 2);
  EXPECT_EQ(Value(text, Series("grpc_server_handled_total", "Info", "unary", "OK")), 2);
  EXPECT_EQ(Value(text, Series("grpc_server_handling_seconds_count", "Info", "unary")), 2);
  EXPECT_EQ(Value(text, Series("grpc_server_msg_received_total", "Append", "client_stream")), 3);
  EXPECT_EQ(Value(text, Series("grpc_server_msg_sent_total", "Append", "client_stream")), 1);
  EXPECT_EQ(Value(text, Series("grpc_server_handled_total", "Append", "client_stream", "OK")), 1);
  EXPECT_EQ(Value(text, Series("grpc_server_msg_received_total", "Read", "server_stream")), 1);
  EXPECT_EQ(Value(text, Series("grpc_server_msg_sent_total", "Read", "server_stream")), 2);
  EXPECT_EQ(Value(text, Series("grpc_server_handled_total", "Release", "unary", "NotFound")), 1);
  EXPECT_EQ(Value(text, Series("grpc_server_handled_total", "Attend", "unary", "InvalidArgument")), 1);
  EXPECT_EQ(Value(text, Series("grpc_server_handled_total", "Attend", "unary", "OK")), 0);
  // driftkv's own histogram counts the same calls.
  EXPECT_EQ(Value(text, "driftkv_rpc_duration_seconds_count{code=\"NOT_FOUND\",method=\"Release\"}"), 1);
  // +Inf bucket = count.
  EXPECT_EQ(Value(text,
                  "grpc_server_handling_seconds_bucket{grpc_method=\"Info\",grpc_service="
                  "\"driftkv.v1.KvCache\",grpc_type=\"unary\",le=\"+Inf\"}"),
            2);
}

TEST(GrpcCodeGoName, MatchesGoSpelling) {
  EXPECT_STREQ(GrpcCodeGoName(grpc::OK), "OK");
  EXPECT_STREQ(GrpcCodeGoName(grpc::CANCELLED), "Canceled");
  EXPECT_STREQ(GrpcCodeGoName(grpc::RESOURCE_EXHAUSTED), "ResourceExhausted");
  EXPECT_STREQ(GrpcCodeGoName(grpc::DATA_LOSS), "DataLoss");
}

}  // namespace
}  // namespace driftkv
