// The fixture of the service's gRPC tests (service_grpc_test.cc,
// service_grpc_retry_test.cc): an in-process server on a loopback port the
// OS picks, driven by driftkv::Client, with a small pool; and a server
// interceptor that loses a method's answers on purpose.
#ifndef DRIFTKV_TESTS_GRPC_TEST_FIXTURE_H_
#define DRIFTKV_TESTS_GRPC_TEST_FIXTURE_H_

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/server_interceptor.h"
#include "service/server.h"
#include "tests/loopback_server.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace grpc_test {

using testing::SmallOptions;

constexpr int kN = 128, kD = 64;

// Replaces the status of the first `budget` calls of `method` with
// UNAVAILABLE after the handler ran: the answer is "lost" in transit.
class LoseAnswers : public grpc::experimental::Interceptor {
 public:
  LoseAnswers(std::atomic<int>* budget, bool matches) : budget_(budget), matches_(matches) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (matches_ && m->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS) &&
        budget_->fetch_sub(1) > 0) {
      m->ModifySendStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "test: answer lost"));
    }
    m->Proceed();
  }

 private:
  std::atomic<int>* budget_;
  bool matches_;
};

class LoseAnswersFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  LoseAnswersFactory(std::string method, std::atomic<int>* budget) : method_(std::move(method)), budget_(budget) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new LoseAnswers(budget_, absl::EndsWith(info->method(), method_));
  }

 private:
  std::string method_;
  std::atomic<int>* budget_;
};

class GrpcTest : public testing::LoopbackFixture {
 protected:
  void Start(ServiceOptions o = SmallOptions(), ServerHooks hooks = {}) {
    ClientOptions co;
    co.timeout = absl::Seconds(20);
    LoopbackFixture::Start(o, std::move(hooks), co);
  }
  void SetUp() override { Start(); }
  // Starts the server again with `o`, its first `*budget` answers of
  // `method` lost after the handler ran (LoseAnswers).
  void StartLosingAnswers(const std::string& method, std::atomic<int>* budget,
                          const ServiceOptions& o = SmallOptions()) {
    ServerHooks hooks;
    hooks.interceptors.push_back(std::make_unique<LoseAnswersFactory>(method, budget));
    Start(o, std::move(hooks));
  }

  std::vector<v1::AppendChunk> Chunks(const std::string& seq, uint32_t layer, const testing::Kv& kv, int first,
                                      int tokens, int chunk) {
    std::vector<v1::AppendChunk> out;
    for (int t = first; t < first + tokens; t += chunk) {
      const int c = std::min(chunk, first + tokens - t);
      out.push_back(
          MakeChunk(seq, layer, t, c, kv.keys.data() + t * kN, kv.values.data() + t * kN, kN, v1::DTYPE_BF16));
    }
    return out;
  }
  uint64_t Stored() {
    absl::StatusOr<v1::StatsResponse> s = client_->Stats();
    return s.ok() ? s->tokens_compressed() + s->tokens_window() : ~0ull;
  }
};

}  // namespace grpc_test
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_GRPC_TEST_FIXTURE_H_
