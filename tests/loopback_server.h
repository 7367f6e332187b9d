// An in-process DriftkvServer on a loopback port the OS picks, and a
// driftkv::Client pointed at it: the set-up of the tests that drive the
// service over gRPC (the handler alone is tests/handler_fixture.h).
//
// LoopbackFixture is the gtest form: SetUp of the test (or the test itself)
// calls Start; TearDown drops the client, then shuts the server down with a
// grace of one second. StartLoopback is the same start for tests that hold
// their server in a local.
#ifndef DRIFTKV_TESTS_LOOPBACK_SERVER_H_
#define DRIFTKV_TESTS_LOOPBACK_SERVER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace testing {

// Starts a server of `o` (its listen address names the port; SmallOptions:
// 127.0.0.1:0) and a client of `co` with its target set to that server.
inline absl::Status StartLoopback(const ServiceOptions& o, ServerHooks hooks, ClientOptions co,
                                  std::unique_ptr<DriftkvServer>* server, std::unique_ptr<Client>* client) {
  absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o, std::move(hooks));
  if (!s.ok()) return s.status();
  *server = *std::move(s);
  co.target = LoopbackTarget((*server)->port());
  *client = std::make_unique<Client>(co);
  return absl::OkStatus();
}

class LoopbackFixture : public ::testing::Test {
 protected:
  // Replaces the server and the client (the old client goes first).
  void Start(const ServiceOptions& o = SmallOptions(), ServerHooks hooks = {}, ClientOptions co = {}) {
    client_.reset();
    server_.reset();
    absl::Status st = StartLoopback(o, std::move(hooks), std::move(co), &server_, &client_);
    ASSERT_TRUE(st.ok()) << st;
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  std::unique_ptr<DriftkvServer> server_;
  std::unique_ptr<Client> client_;
};

// A loopback server of SmallOptions and its client, for inline Attend:
// through gRPC's sleeping door, or the polling one on both sides with
// 1 MiB socket reads (as a data-plane deployment sets them).
struct InlineDoor {
  explicit InlineDoor(bool polling) {
    ServiceOptions o = SmallOptions();
    ClientOptions co;
    co.timeout = absl::Seconds(20);
    if (polling) {
      o.attend_poll_threads = 2;
      o.attend_poll_spin_us = 50;
      o.grpc_read_chunk_bytes = 1 << 20;
      co.poll_attend = true;
      co.read_chunk_bytes = 1 << 20;
    }
    absl::Status st = StartLoopback(o, {}, co, &server, &client);
    EXPECT_TRUE(st.ok()) << st;
  }
  ~InlineDoor() {
    client.reset();
    if (server) server->Shutdown(absl::Seconds(1));
  }
  // Sequences "s0".."s<sequences - 1>", sequence s holding the first
  // `tokens - 10 s` tokens of `kv` (rows of kSmallN) in layers 0 and 1.
  void Fill(const Kv& kv, int sequences, int tokens) {
    for (int s = 0; s < sequences; ++s) {
      std::vector<v1::AppendChunk> chunks;
      for (uint32_t l = 0; l < 2; ++l) chunks.push_back(ChunkOf(absl::StrCat("s", s), l, 0, tokens - 10 * s, kv));
      absl::StatusOr<v1::AppendResponse> r = client->Append(chunks);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  std::unique_ptr<DriftkvServer> server;
  std::unique_ptr<Client> client;
};

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_LOOPBACK_SERVER_H_
