// Client certificates bound to tokens and tenants, and credentials
// reloaded without a restart (docs/security.md, "Certificates bound to
// tenants", "Reloading credentials"), over real loopback connections with a
// CA and certificates minted by `openssl` at test time.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"
#include "proto/driftkv.grpc.pb.h"
#include "service/config.h"
#include "service/server.h"
#include "service/tenant_quotas.h"
#include "service/tokens.h"
#include "tests/grpc_health_v1.grpc.pb.h"
#include "tests/server_process.h"
#include "tests/service_http.h"
#include "tests/service_test_util.h"
#include "tests/tenant_server.h"

namespace driftkv {
namespace {

using testing::SmallOptions;
using testing::SyntheticKv;
using C = absl::StatusCode;

constexpr int kN = 128;
using testing::kAliceToken;
using testing::kBobToken;
using testing::ReplaceText;
using testing::Slurp;
using testing::WriteText;
const char kCarolToken[] = "carol-00112233445566778899aabbccddeeff";

bool Run(const std::string& cmd) {
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) == 0) return true;
  ADD_FAILURE() << "failed: " << cmd;
  return false;
}

// Under `d`: CA "ca" and CA "ca2"; server certificates for 127.0.0.1 from
// each (server, server2); client certificates from ca: alice-worker (SAN
// DNS:alice.workers.example), alice, bob; from ca2: carol.
bool MintTwoCaPki(const std::string& d) {
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  WriteText(d + "/server.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  WriteText(d + "/alice-worker.ext", "subjectAltName=DNS:alice.workers.example\n");
  for (const char* ca : {"ca", "ca2"}) {
    if (!Run(absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/", ca, ".key -out ", d, "/", ca,
                          ".pem -days 2 -subj /CN=", ca))) {
      return false;
    }
  }
  struct Leaf {
    const char *name, *ca, *cn, *ext;
  };
  const Leaf leaves[] = {{"server", "ca", "localhost", "server.ext"},
                         {"server2", "ca2", "localhost", "server.ext"},
                         {"alice-worker", "ca", "alice-worker", "alice-worker.ext"},
                         {"alice", "ca", "alice", nullptr},
                         {"bob", "ca", "bob", nullptr},
                         {"carol", "ca2", "carol", nullptr}};
  for (const Leaf& l : leaves) {
    if (!Run(absl::StrCat("openssl req ", key, " -keyout ", d, "/", l.name, ".key -out ", d, "/", l.name,
                          ".csr -subj /CN=", l.cn)) ||
        !Run(absl::StrCat("openssl x509 -req -in ", d, "/", l.name, ".csr -CA ", d, "/", l.ca, ".pem -CAkey ", d, "/",
                          l.ca, ".key -CAcreateserial -days 2 -out ", d, "/", l.name, ".pem",
                          l.ext != nullptr ? absl::StrCat(" -extfile ", d, "/", l.ext) : std::string()))) {
      return false;
    }
  }
  return true;
}

std::string TokenLine(const char* token, const std::string& rest) {
  return absl::StrCat(Sha256Hex(token), " ", rest, "\n");
}

class CredentialTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    pki_ = new std::string(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/pki"));
    ASSERT_EQ(std::system(("mkdir -p " + *pki_).c_str()), 0);
    ASSERT_TRUE(MintTwoCaPki(*pki_));
  }
  static std::string P(const std::string& name) { return *pki_ + "/" + name; }

  void SetUp() override {
    // The files the server is configured with, as a Secret mount would
    // hold them; each test rewrites them.
    dir_ = absl::StrCat(*pki_, "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(std::system(("mkdir -p " + dir_).c_str()), 0);
    ReplaceText(F("tls.crt"), Slurp(P("server.pem")));
    ReplaceText(F("tls.key"), Slurp(P("server.key")));
    ReplaceText(F("ca.crt"), Slurp(P("ca.pem")));
  }
  std::string F(const std::string& name) const { return dir_ + "/" + name; }

  // mTLS with tokens from F("tokens") (written by the test first).
  void Start(bool tenant_from_certificate = false, double reload_interval_seconds = 0.0, bool client_ca = true,
             uint64_t max_sequences = 64) {
    ServiceOptions o = SmallOptions();
    o.max_sequences = max_sequences;
    o.metrics_listen = "127.0.0.1:0";
    o.tls_cert_file = F("tls.crt");
    o.tls_key_file = F("tls.key");
    if (client_ca) o.tls_client_ca_file = F("ca.crt");
    o.tokens_file = F("tokens");
    absl::StatusOr<TokenTable> t = ReadTokensFile(o.tokens_file, client_ca);
    ASSERT_TRUE(t.ok()) << t.status();
    o.tokens = std::make_shared<const TokenTable>(*std::move(t));
    // The tenants' shares, as ResolveConfig resolves them.
    absl::StatusOr<TenantQuota> defaults =
        ResolveTenantDefaults(o.tenant_settings, o.tokens.get(), o.tokens_file, o.max_sequences, o.nccl_max_channels);
    ASSERT_TRUE(defaults.ok()) << defaults.status();
    o.tenant_defaults = *defaults;
    o.tenant_from_certificate = tenant_from_certificate;
    o.reload_interval_seconds = reload_interval_seconds;
    absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  ClientOptions Options(const std::string& token, const std::string& cert, const std::string& ca = "ca") const {
    ClientOptions o;
    o.target = testing::LoopbackTarget(server_->port());
    o.timeout = absl::Seconds(5);
    o.max_attempts = 1;
    o.tls_ca_file = P(ca + ".pem");
    o.tls_cert_file = P(cert + ".pem");
    o.tls_key_file = P(cert + ".key");
    o.token = token;
    return o;
  }
  absl::Status InfoAs(const std::string& token, const std::string& cert) const {
    return Client(Options(token, cert)).Info().status();
  }
  // Info over a connection of its own (a subchannel pool of its own), so
  // that the handshake shows which certificates the server holds now.
  grpc::Status InfoOnNewConnection(const std::string& trusted_ca, const std::string& cert,
                                   const std::string& token) const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(
        testing::LoopbackTarget(server_->port()),
        grpc::SslCredentials({Slurp(P(trusted_ca + ".pem")), Slurp(P(cert + ".key")), Slurp(P(cert + ".pem"))}), args);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::InfoRequest req;
    v1::InfoResponse resp;
    return v1::KvCache::NewStub(channel)->Info(&ctx, req, &resp);
  }
  double Metric(const std::string& series) const {
    return testing::MetricValue(testing::HttpGet(server_->metrics_port(), "/metrics"), series);
  }

  static std::string* pki_;
  std::string dir_;
  std::unique_ptr<DriftkvServer> server_;
};
std::string* CredentialTest::pki_ = nullptr;

const char kTokensOk[] = "driftkv_credential_reloads_total{file=\"tokens_file\",outcome=\"ok\"}";
const char kTokensFailed[] = "driftkv_credential_reloads_total{file=\"tokens_file\",outcome=\"failed\"}";
const char kTlsOk[] = "driftkv_credential_reloads_total{file=\"tls\",outcome=\"ok\"}";
const char kTlsFailed[] = "driftkv_credential_reloads_total{file=\"tls\",outcome=\"failed\"}";

TEST(TokenBindingParseTest, CertNamesAreReadAndCheckedPerLine) {
  absl::StatusOr<TokenTable> t = TokenTable::Parse(
      absl::StrCat(TokenLine(kAliceToken, "alice cert=alice-worker cert=spiffe://x/alice max_pages=5"),
                   TokenLine(kBobToken, "bob")),
      "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->binds_certificates());
  const TokenGrant* alice = t->Find(kAliceToken);
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_EQ(alice->certificates, (std::vector<std::string>{"alice-worker", "spiffe://x/alice"}));
  EXPECT_EQ(t->QuotaOf("alice", {}).max_pages, 5u);
  EXPECT_TRUE(t->Find(kBobToken)->certificates.empty());
  EXPECT_EQ(t->Find("nope"), nullptr);
  absl::StatusOr<TokenTable> bad = TokenTable::Parse(TokenLine(kAliceToken, "alice cert="), "tokens");
  EXPECT_EQ(bad.status().code(), C::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "tokens line 1: \"cert=\"")) << bad.status();
  EXPECT_FALSE(TokenTable::Parse(TokenLine(kBobToken, "bob"), "t")->binds_certificates());
}

TEST(TokenBindingConfigTest, BindingsNeedMtlsAndTheIntervalIsChecked) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/config");
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  WriteText(dir + "/cert.pem", "x");
  WriteText(dir + "/key.pem", "x");
  WriteText(dir + "/tokens", TokenLine(kAliceToken, "alice cert=alice-worker"));
  v1::ServerConfig c;
  c.mutable_model()->set_layers(2);
  c.mutable_model()->set_kv_heads(2);
  c.mutable_model()->set_head_dim(64);
  c.set_pool_bytes(1 << 20);
  c.set_tls_cert_file(dir + "/cert.pem");
  c.set_tls_key_file(dir + "/key.pem");
  c.set_tokens_file(dir + "/tokens");
  absl::StatusOr<ServiceOptions> o = ResolveConfig(c);
  EXPECT_EQ(o.status().code(), C::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(o.status().message(),
                                "binds tokens to client certificates (cert=) and needs "
                                "tls_client_ca_file"))
      << o.status();
  c.set_tls_client_ca_file(dir + "/cert.pem");
  o = ResolveConfig(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->tenant_from_certificate);
  EXPECT_EQ(o->reload_interval_seconds, 0.0);
  c.set_tenant_from_certificate(true);
  c.set_reload_interval_seconds(5);
  o = ResolveConfig(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tenant_from_certificate);
  EXPECT_EQ(o->reload_interval_seconds, 5.0);
  v1::ServerConfig bad = c;
  bad.clear_tls_client_ca_file();
  WriteText(dir + "/tokens", TokenLine(kAliceToken, "alice"));
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(),
                                "tenant_from_certificate needs tokens_file "
                                "and tls_client_ca_file"))
      << ResolveConfig(bad).status();
  bad = c;
  bad.set_reload_interval_seconds(-1);
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(), "reload_interval_seconds -1 out of range"))
      << ResolveConfig(bad).status();
}

// A token bound to a certificate opens nothing over a connection with
// another certificate, on every method and every service of the port.
TEST_F(CredentialTest, CertBoundTokenIsRefusedWithAnotherCertificate) {
  WriteText(F("tokens"), absl::StrCat(TokenLine(kAliceToken, "alice cert=alice-worker"), TokenLine(kBobToken, "bob"),
                                      TokenLine(kCarolToken, "carol cert=alice.workers.example")));
  Start();
  EXPECT_TRUE(InfoAs(kAliceToken, "alice-worker").ok()) << InfoAs(kAliceToken, "alice-worker");
  EXPECT_TRUE(InfoAs(kCarolToken, "alice-worker").ok()) << "a subjectAltName binds too";
  EXPECT_TRUE(InfoAs(kBobToken, "alice-worker").ok()) << "an unbound token goes with any certificate";
  EXPECT_TRUE(InfoAs(kBobToken, "bob").ok());

  Client thief(Options(kAliceToken, "bob"));
  const testing::Kv kv = SyntheticKv(20, kN, 1);
  v1::AppendChunk chunk = MakeChunk("s", 0, 0, 20, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
  absl::StatusOr<v1::AppendResponse> append = thief.Append({&chunk, 1});
  EXPECT_EQ(append.status().code(), C::kUnauthenticated) << append.status();
  v1::AttendRequest attend;
  attend.add_items()->set_sequence_id("s");
  EXPECT_EQ(thief.Attend(attend).status().code(), C::kUnauthenticated);
  v1::ReadRequest read;
  read.set_sequence_id("s");
  EXPECT_EQ(thief.Read(read).status().code(), C::kUnauthenticated);
  EXPECT_EQ(thief.Release("s").status().code(), C::kUnauthenticated);
  EXPECT_EQ(thief.Length("s").status().code(), C::kUnauthenticated);
  EXPECT_EQ(thief.Info().status().code(), C::kUnauthenticated);
  absl::StatusOr<v1::StatsResponse> stats = thief.Stats();
  EXPECT_EQ(stats.status().code(), C::kUnauthenticated);
  // Names the rule and what the connection presented, not the tenant or
  // the names the token is bound to.
  const std::string message(stats.status().message());
  EXPECT_TRUE(absl::StrContains(message, "bound to client certificates")) << message;
  EXPECT_TRUE(absl::StrContains(message, "subject CN \"bob\"")) << message;
  EXPECT_FALSE(absl::StrContains(message, "alice")) << message;
  // Health on the main port is behind the same gate.
  auto channel =
      grpc::CreateChannel(testing::LoopbackTarget(server_->port()),
                          grpc::SslCredentials({Slurp(P("ca.pem")), Slurp(P("bob.key")), Slurp(P("bob.pem"))}));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAliceToken));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_EQ(grpc::health::v1::Health::NewStub(channel)->Check(&ctx, req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Nothing got in.
  absl::StatusOr<v1::StatsResponse> alice = Client(Options(kAliceToken, "alice-worker")).Stats();
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->tenant_sequences(), 0u);
  EXPECT_EQ(alice->tenant(), "alice");
  EXPECT_EQ(Metric("driftkv_unauthenticated_total"), 8);
}

TEST_F(CredentialTest, TenantFromCertificateNeedsTheSubjectCnToBeTheTenant) {
  WriteText(F("tokens"), absl::StrCat(TokenLine(kAliceToken, "alice"), TokenLine(kBobToken, "bob")));
  Start(/*tenant_from_certificate=*/true);
  absl::StatusOr<v1::StatsResponse> stats = Client(Options(kAliceToken, "alice")).Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tenant(), "alice");
  EXPECT_TRUE(InfoAs(kBobToken, "bob").ok());
  for (const char* cert : {"bob", "alice-worker"}) {
    absl::Status st = InfoAs(kAliceToken, cert);
    EXPECT_EQ(st.code(), C::kUnauthenticated) << cert << ": " << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "tenant_from_certificate")) << st;
    EXPECT_FALSE(absl::StrContains(st.message(), "alice\"")) << st;
  }
  EXPECT_EQ(InfoAs(kBobToken, "alice").code(), C::kUnauthenticated);
}

TEST_F(CredentialTest, ReloadTakesAddedTokensAndDropsRemovedOnes) {
  WriteText(F("tokens"), TokenLine(kAliceToken, "alice"));
  Start();
  Client alice(Options(kAliceToken, "alice")), carol(Options(kCarolToken, "carol", "ca"));
  // carol's certificate is from ca2, not trusted yet: she uses alice's
  // connection certificate here; the token is what is reloaded.
  Client carol_token(Options(kCarolToken, "alice"));
  ASSERT_TRUE(alice.Info().ok());
  EXPECT_EQ(carol_token.Info().status().code(), C::kUnauthenticated);
  // Carol added, alice removed, and bob bound to a certificate.
  ReplaceText(F("tokens"),
              absl::StrCat(TokenLine(kCarolToken, "carol max_sequences=1"), TokenLine(kBobToken, "bob cert=bob")));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  // The same clients, on the same connections: every call is checked
  // against the tokens in force.
  EXPECT_TRUE(carol_token.Info().ok()) << carol_token.Info().status();
  EXPECT_EQ(alice.Info().status().code(), C::kUnauthenticated);
  EXPECT_TRUE(InfoAs(kBobToken, "bob").ok());
  EXPECT_EQ(InfoAs(kBobToken, "alice").code(), C::kUnauthenticated);
  // A tenant first seen after the reload gets its quota from the new file.
  const testing::Kv kv = SyntheticKv(10, kN, 2);
  v1::AppendChunk one = MakeChunk("one", 0, 0, 10, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
  v1::AppendChunk two = MakeChunk("two", 0, 0, 10, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
  ASSERT_TRUE(carol_token.Append({&one, 1}).ok());
  EXPECT_EQ(carol_token.Append({&two, 1}).status().code(), C::kResourceExhausted);
  EXPECT_EQ(Metric(kTokensOk), 1);
  EXPECT_EQ(Metric(kTokensFailed), 0);
}

// The shares of max_sequences follow the file's tenants: a reload that
// adds a tenant halves the first one's share, for a tenant already seen
// too, and a file whose limits break the guarantee is refused.
TEST_F(CredentialTest, ReloadResolvesTheTenantsSharesAgain) {
  WriteText(F("tokens"), TokenLine(kAliceToken, "alice"));
  Start(false, 0.0, true, /*max_sequences=*/4);
  Client alice(Options(kAliceToken, "alice"));
  const testing::Kv kv = SyntheticKv(10, kN, 3);
  auto append = [&](Client& c, const std::string& id) {
    v1::AppendChunk chunk = MakeChunk(id, 0, 0, 10, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
    return c.Append({&chunk, 1}).status();
  };
  for (const char* id : {"a1", "a2", "a3"}) ASSERT_TRUE(append(alice, id).ok()) << id;  // her share is 4
  ReplaceText(F("tokens"), absl::StrCat(TokenLine(kAliceToken, "alice"), TokenLine(kCarolToken, "carol")));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  Client carol(Options(kCarolToken, "alice"));
  // Shares of 2 each: alice, holding 3, is refused until she is under 2.
  absl::Status st = append(alice, "a4");
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "quota max_sequences 2: it holds 3 sequences")) << st;
  EXPECT_TRUE(append(carol, "c1").ok());
  absl::StatusOr<v1::StatsResponse> stats = carol.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tenant_max_sequences(), 2u);
  // Limits that add up to more than max_sequences are refused; the shares
  // in force stay.
  ReplaceText(F("tokens"), absl::StrCat(TokenLine(kAliceToken, "alice max_sequences=3"),
                                        TokenLine(kCarolToken, "carol max_sequences=3")));
  st = server_->ReloadCredentials();
  EXPECT_EQ(st.code(), C::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "add up to 6")) << st;
  EXPECT_EQ(Metric(kTokensFailed), 1);
  EXPECT_EQ(alice.Stats()->tenant_max_sequences(), 2u);
}

TEST_F(CredentialTest, BadTokensFileIsRefusedAndTheTokensInForceStay) {
  WriteText(F("tokens"), TokenLine(kAliceToken, "alice"));
  Start(false, 0.0, /*client_ca=*/true);
  const std::string cases[] = {
      absl::StrCat(kCarolToken, " carol\n"),           // a token pasted instead of its hash
      "# every token removed by mistake\n",            // no token: everyone would be locked out
      TokenLine(kCarolToken, "carol max_pages=lots"),  // a bad option
  };
  int failed = 0;
  for (const std::string& text : cases) {
    ReplaceText(F("tokens"), text);
    absl::Status st = server_->ReloadCredentials();
    EXPECT_EQ(st.code(), C::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(st.message(), F("tokens"))) << st;
    EXPECT_EQ(Metric(kTokensFailed), ++failed);
    EXPECT_TRUE(InfoAs(kAliceToken, "alice").ok()) << text;
    EXPECT_EQ(InfoAs(kCarolToken, "alice").code(), C::kUnauthenticated) << text;
  }
  ::unlink(F("tokens").c_str());
  EXPECT_EQ(server_->ReloadCredentials().code(), C::kInvalidArgument);
  EXPECT_TRUE(InfoAs(kAliceToken, "alice").ok());
  EXPECT_EQ(Metric(kTokensOk), 0);
}

TEST_F(CredentialTest, BindingsInTheTokensFileNeedMtlsOnReloadToo) {
  WriteText(F("tokens"), TokenLine(kAliceToken, "alice"));
  Start(false, 0.0, /*client_ca=*/false);
  ReplaceText(F("tokens"), TokenLine(kAliceToken, "alice cert=alice"));
  absl::Status st = server_->ReloadCredentials();
  EXPECT_TRUE(absl::StrContains(st.message(), "needs tls_client_ca_file")) << st;
  EXPECT_EQ(Metric(kTokensFailed), 1);
}

// New connections get the new server certificate and client CA; the old
// trust stops working for them.
TEST_F(CredentialTest, ReloadedCertificatesServeNewConnections) {
  WriteText(F("tokens"), absl::StrCat(TokenLine(kAliceToken, "alice"), TokenLine(kCarolToken, "carol")));
  Start();
  ASSERT_TRUE(InfoOnNewConnection("ca", "alice", kAliceToken).ok());
  EXPECT_EQ(InfoOnNewConnection("ca2", "carol", kCarolToken).error_code(), grpc::StatusCode::UNAVAILABLE);
  ReplaceText(F("tls.crt"), Slurp(P("server2.pem")));
  ReplaceText(F("tls.key"), Slurp(P("server2.key")));
  ReplaceText(F("ca.crt"), Slurp(P("ca2.pem")));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  grpc::Status st = InfoOnNewConnection("ca2", "carol", kCarolToken);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(InfoOnNewConnection("ca", "alice", kAliceToken).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Metric(kTlsOk), 1);
  EXPECT_EQ(Metric(kTlsFailed), 0);
}

TEST_F(CredentialTest, BadCertificateFilesAreRefusedAndTheOnesInForceStay) {
  WriteText(F("tokens"), TokenLine(kAliceToken, "alice"));
  Start();
  struct Case {
    const char* file;
    std::string text;
    const char* error;
  };
  const Case cases[] = {
      {"tls.key", Slurp(P("server2.key")), "is not the private key of the certificate"},  // half a rotation
      {"tls.crt", "-----BEGIN CERTIFICATE-----\nnot base64\n", "holds no PEM certificate"},
      {"ca.crt", "", "tls_client_ca_file"},
  };
  int failed = 0;
  for (const Case& c : cases) {
    SetUp();  // the good files back
    ReplaceText(F(c.file), c.text);
    absl::Status st = server_->ReloadCredentials();
    EXPECT_EQ(st.code(), C::kInvalidArgument) << c.file;
    EXPECT_TRUE(absl::StrContains(st.message(), c.error)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), F(c.file))) << st;
    EXPECT_EQ(Metric(kTlsFailed), ++failed);
    grpc::Status call = InfoOnNewConnection("ca", "alice", kAliceToken);
    EXPECT_TRUE(call.ok()) << c.file << ": " << call.error_message();
  }
  EXPECT_EQ(Metric(kTlsOk), 0);
}

TEST_F(CredentialTest, TheWatchReloadsChangedFilesAndRefusesBadOnesOnce) {
  WriteText(F("tokens"), TokenLine(kAliceToken, "alice"));
  Start(false, /*reload_interval_seconds=*/0.05);
  ReplaceText(F("tokens"), absl::StrCat(TokenLine(kAliceToken, "alice"), TokenLine(kCarolToken, "carol")));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!InfoAs(kCarolToken, "alice").ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(InfoAs(kCarolToken, "alice").ok());
  EXPECT_EQ(Metric(kTokensOk), 1);
  EXPECT_EQ(Metric(kTlsOk), 0) << "unchanged TLS files are not reloaded";
  ReplaceText(F("tokens"), "garbage\n");
  while (Metric(kTokensFailed) < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(300));  // several more looks
  EXPECT_EQ(Metric(kTokensFailed), 1) << "a bad file is refused once, not at every look";
  EXPECT_TRUE(InfoAs(kCarolToken, "alice").ok());
  ReplaceText(F("tls.key"), Slurp(P("server.key")));  // same bytes, new inode
  while (Metric(kTlsOk) < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Metric(kTlsOk), 1);
}

}  // namespace
}  // namespace driftkv
