// driftkv-server reloads tokens_file on SIGHUP and keeps serving: an added
// token works, a removed one stops, a bad file is refused with a log line
// and the tokens in force stay (docs/security.md, "Reloading credentials").
// The process itself, so that main's signal handling is what is tested.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/server_process.h"
#include "tests/tenant_server.h"

namespace driftkv {
namespace {

using testing::kAliceToken;
using testing::kBobToken;
using testing::ReplaceText;
using testing::ServerProcess;
using testing::Slurp;

std::string g_server;  // argv[1]

// Polls `ok` for up to 10 s.
template <typename F>
bool Eventually(F ok) {
  for (const absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(50))) {
    if (ok()) return true;
  }
  return ok();
}

TEST(CredentialSighupTest, SighupReloadsTheTokensFileAndRefusesABadOne) {
  const std::string d = testing::TestDir() + "/sighup";
  ASSERT_EQ(std::system(("mkdir -p " + d).c_str()), 0);
  ASSERT_TRUE(testing::MintPki(d));
  ReplaceText(d + "/tokens", absl::StrCat(Sha256Hex(kAliceToken), " alice\n"));
  const std::string config = d + "/server.textproto";
  std::ofstream(config) << "model { layers: 2 kv_heads: 2 head_dim: 64 }\npool_bytes: 8388608\n"
                        << "drain_notice_seconds: 0\ntls_cert_file: \"" << d << "/server.pem\"\n"
                        << "tls_key_file: \"" << d << "/server.key\"\ntokens_file: \"" << d << "/tokens\"\n";
  ServerProcess server;
  const std::string log = d + "/server.log";
  ASSERT_TRUE(server.Start(g_server, config, log)) << Slurp(log);
  auto info = [&](const char* token) {
    ClientOptions o;
    o.target = testing::LoopbackTarget(server.port);
    o.max_attempts = 1;
    o.timeout = absl::Seconds(5);
    o.tls_ca_file = d + "/ca.pem";
    o.token = token;
    return Client(o).Info().status().code();
  };
  EXPECT_EQ(info(kAliceToken), absl::StatusCode::kOk);
  EXPECT_EQ(info(kBobToken), absl::StatusCode::kUnauthenticated);

  ReplaceText(d + "/tokens", absl::StrCat(Sha256Hex(kBobToken), " bob\n"));
  ASSERT_EQ(kill(server.pid, SIGHUP), 0);
  EXPECT_TRUE(Eventually([&] { return info(kBobToken) == absl::StatusCode::kOk; })) << Slurp(log);
  EXPECT_EQ(info(kAliceToken), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(Slurp(log), "taken: 1 tokens")) << Slurp(log);

  ReplaceText(d + "/tokens", "not a tokens file\n");
  ASSERT_EQ(kill(server.pid, SIGHUP), 0);
  EXPECT_TRUE(Eventually([&] { return absl::StrContains(Slurp(log), "refused, the tokens in force stay"); }))
      << Slurp(log);
  EXPECT_TRUE(absl::StrContains(Slurp(log), d + "/tokens line 1")) << Slurp(log);
  EXPECT_EQ(info(kBobToken), absl::StatusCode::kOk);

  ASSERT_EQ(kill(server.pid, SIGTERM), 0);
  EXPECT_EQ(server.Wait(), 0) << Slurp(log);
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: credential_sighup_test SERVER\n");
    return 2;
  }
  driftkv::g_server = argv[1];
  return RUN_ALL_TESTS();
}
