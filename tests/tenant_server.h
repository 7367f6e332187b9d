// An in-process server with TLS, two tenants' tokens (alice, bob) and a
// region socket, for the data-plane tests (AttendStream, doorbells): the
// setup of tests/regions_e2e_test.cc as a fixture, plus one stored
// sequence of alice's and the Attend requests over it.
#ifndef DRIFTKV_TESTS_TENANT_SERVER_H_
#define DRIFTKV_TESTS_TENANT_SERVER_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "service/tokens.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace testing {

inline const char kAliceToken[] = "alice-0123456789abcdef0123456789abcdef";
inline const char kBobToken[] = "bob-fedcba9876543210fedcba9876543210";

inline std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Writes `text` to a temporary file, then renames it over `path`: a new
// inode, as a Kubernetes Secret update gives, and never a half-written file.
inline void ReplaceText(const std::string& path, const std::string& text) {
  WriteText(path + ".tmp", text);
  ASSERT_EQ(std::rename((path + ".tmp").c_str(), path.c_str()), 0) << path;
}

// A CA and a server certificate for 127.0.0.1 in `d` (tokens need TLS).
inline bool MintPki(const std::string& d) {
  WriteText(d + "/server.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string cmds[] = {
      absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/ca.key -out ", d, "/ca.pem -days 2 -subj /CN=test-ca"),
      absl::StrCat("openssl req ", key, " -keyout ", d, "/server.key -out ", d, "/server.csr -subj /CN=localhost"),
      absl::StrCat("openssl x509 -req -in ", d, "/server.csr -CA ", d, "/ca.pem -CAkey ", d,
                   "/ca.key -CAcreateserial -days 2 -extfile ", d, "/server.ext -out ", d, "/server.pem"),
  };
  for (const std::string& c : cmds) {
    if (std::system((c + " >/dev/null 2>&1").c_str()) != 0) {
      ADD_FAILURE() << "failed: " << c;
      return false;
    }
  }
  return true;
}

class TenantServerTest : public ::testing::Test {
 protected:
  static constexpr int kTokens = 100;  // alice's sequence "s" on both layers
  static constexpr int kQHeads = 4;

  static void SetUpTestSuite() {
    dir_ = new std::string(TestDir() + "/tenant-pki");
    ASSERT_EQ(std::system(("mkdir -p " + *dir_).c_str()), 0);
    ASSERT_TRUE(MintPki(*dir_));
    WriteText(*dir_ + "/tokens", absl::StrCat(Sha256Hex(kAliceToken), " alice\n", Sha256Hex(kBobToken), " bob\n"));
  }
  void SetUp() override {
    ServiceOptions o = SmallOptions();
    o.tls_cert_file = *dir_ + "/server.pem";
    o.tls_key_file = *dir_ + "/server.key";
    absl::StatusOr<TokenTable> t = TokenTable::ReadFile(*dir_ + "/tokens");
    ASSERT_TRUE(t.ok()) << t.status();
    o.tokens = std::make_shared<const TokenTable>(*std::move(t));
    // sun_path holds 107 bytes: TEST_TMPDIR may be longer. /tmp is shared
    // between tests that run at once, each in its own PID namespace where
    // the pid is the same: a random name.
    std::random_device rd;
    const uint64_t nonce = uint64_t{rd()} << 32 | rd();
    socket_ = absl::StrCat("/tmp/driftkv-tenant-test-", absl::Hex(nonce), ".sock");
    o.region_socket = socket_;
    absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    alice_ = std::make_unique<Client>(Options(kAliceToken));
    bob_ = std::make_unique<Client>(Options(kBobToken));
    const Kv kv = SyntheticKv(kTokens, kSmallN, 7);
    std::vector<v1::AppendChunk> chunks;
    for (uint32_t layer = 0; layer < 2; ++layer) chunks.push_back(ChunkOf("s", layer, 0, kTokens, kv));
    absl::StatusOr<v1::AppendResponse> appended = alice_->Append(chunks);
    ASSERT_TRUE(appended.ok()) << appended.status();
  }
  void TearDown() override {
    alice_.reset();
    bob_.reset();
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
  }
  ClientOptions Options(const std::string& token) const {
    ClientOptions o;
    o.target = absl::StrCat("127.0.0.1:", server_->port());
    o.timeout = absl::Seconds(5);
    o.max_attempts = 1;
    o.tls_ca_file = *dir_ + "/ca.pem";
    o.token = token;
    return o;
  }
  // An Attend of sequence `seq` with one inline query per layer.
  static v1::AttendRequest Request(uint32_t seed, const std::string& seq = "s") {
    v1::AttendRequest r;
    for (uint32_t layer = 0; layer < 2; ++layer) {
      *r.add_items() = QueryItem(seq, layer, SyntheticQuery(kQHeads, 64, seed * 2 + layer), kQHeads);
    }
    return r;
  }

  static std::string* dir_;
  std::string socket_;
  std::unique_ptr<DriftkvServer> server_;
  std::unique_ptr<Client> alice_, bob_;
};
inline std::string* TenantServerTest::dir_ = nullptr;

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_TENANT_SERVER_H_
