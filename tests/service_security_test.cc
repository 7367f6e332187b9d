// Transport security over real loopback connections: a CA and certificates
// minted with `openssl` at test time; TLS, mTLS (a client without a
// certificate, or with one from another CA, has its handshake refused),
// bearer tokens (missing or wrong: UNAUTHENTICATED on every method),
// tenants kept apart over the wire, quotas from the tokens file, and the
// health port and /metrics reachable without a token.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "service/tokens.h"
#include "tests/grpc_health_v1.grpc.pb.h"
#include "tests/service_http.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::SmallOptions;
using testing::SyntheticKv;
using C = absl::StatusCode;

constexpr int kN = 128;
const char kAliceToken[] = "alice-0123456789abcdef0123456789abcdef";
const char kBobToken[] = "bob-fedcba9876543210fedcba9876543210";

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The lines of `text` that contain `word` (a failure message's excerpt of
// a /metrics page).
std::string LinesWith(const std::string& text, const std::string& word) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, word)) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// A CA, a server certificate for 127.0.0.1/localhost, a client certificate
// from that CA, and one from another CA. P-256 keys: fast to make.
bool MintPki(const std::string& d) {
  WriteText(d + "/server.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string cmds[] = {
      absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/ca.key -out ", d, "/ca.pem -days 2 -subj /CN=test-ca"),
      absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/rogue-ca.key -out ", d,
                   "/rogue-ca.pem -days 2 -subj /CN=rogue-ca"),
      absl::StrCat("openssl req ", key, " -keyout ", d, "/server.key -out ", d, "/server.csr -subj /CN=localhost"),
      absl::StrCat("openssl x509 -req -in ", d, "/server.csr -CA ", d, "/ca.pem -CAkey ", d,
                   "/ca.key -CAcreateserial -days 2 -extfile ", d, "/server.ext -out ", d, "/server.pem"),
      absl::StrCat("openssl req ", key, " -keyout ", d, "/client.key -out ", d, "/client.csr -subj /CN=client"),
      absl::StrCat("openssl x509 -req -in ", d, "/client.csr -CA ", d, "/ca.pem -CAkey ", d,
                   "/ca.key -CAcreateserial -days 2 -out ", d, "/client.pem"),
      absl::StrCat("openssl req ", key, " -keyout ", d, "/rogue.key -out ", d, "/rogue.csr -subj /CN=rogue"),
      absl::StrCat("openssl x509 -req -in ", d, "/rogue.csr -CA ", d, "/rogue-ca.pem -CAkey ", d,
                   "/rogue-ca.key -CAcreateserial -days 2 -out ", d, "/rogue.pem"),
  };
  for (const std::string& c : cmds) {
    if (std::system((c + " >/dev/null 2>&1").c_str()) != 0) {
      ADD_FAILURE() << "failed: " << c;
      return false;
    }
  }
  return true;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(Dir() + "/pki");
    ASSERT_EQ(std::system(("mkdir -p " + *dir_).c_str()), 0);
    ASSERT_TRUE(MintPki(*dir_));
    WriteText(*dir_ + "/tokens", absl::StrCat("# driftkv tokens: hashes only\n", Sha256Hex(kAliceToken), " alice\n",
                                              Sha256Hex(kBobToken), " bob max_sequences=1\n"));
  }
  static std::string F(const std::string& name) { return *dir_ + "/" + name; }

  // mTLS + tokens + a health port, unless a test says otherwise.
  void Start(bool client_ca = true, bool tokens = true) {
    ServiceOptions o = SmallOptions();
    o.metrics_listen = "127.0.0.1:0";
    o.health_listen = "127.0.0.1:0";
    o.tls_cert_file = F("server.pem");
    o.tls_key_file = F("server.key");
    if (client_ca) o.tls_client_ca_file = F("ca.pem");
    o.metrics_per_tenant = metrics_per_tenant_;
    if (tokens) {
      absl::StatusOr<TokenTable> t = TokenTable::ReadFile(F("tokens"));
      ASSERT_TRUE(t.ok()) << t.status();
      o.tokens = std::make_shared<const TokenTable>(*std::move(t));
    }
    absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  ClientOptions Options(const std::string& token, const std::string& cert = "client") const {
    ClientOptions o;
    o.target = testing::LoopbackTarget(server_->port());
    o.timeout = absl::Seconds(5);
    o.max_attempts = 1;
    o.tls_ca_file = F("ca.pem");
    if (!cert.empty()) {
      o.tls_cert_file = F(cert + ".pem");
      o.tls_key_file = F(cert + ".key");
    }
    o.token = token;
    return o;
  }
  static v1::AppendChunk Chunk(const std::string& seq, const testing::Kv& kv, uint32_t count) {
    return MakeChunk(seq, 0, 0, count, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  static std::string* dir_;
  bool metrics_per_tenant_ = false;  // read by Start
  std::unique_ptr<DriftkvServer> server_;
};
std::string* SecurityTest::dir_ = nullptr;

TEST_F(SecurityTest, MtlsRefusesTheHandshakeWithoutAClientCertificate) {
  Start();
  Client good(Options(kAliceToken));
  ASSERT_TRUE(good.Info().ok()) << good.Info().status();
  for (const char* cert : {"", "rogue"}) {
    Client c(Options(kAliceToken, cert));
    absl::StatusOr<v1::InfoResponse> info = c.Info();
    EXPECT_EQ(info.status().code(), C::kUnavailable) << cert << ": " << info.status();
  }
  // Plaintext to a TLS port fails as well.
  ClientOptions plain;
  plain.target = testing::LoopbackTarget(server_->port());
  plain.timeout = absl::Seconds(5);
  plain.max_attempts = 1;
  EXPECT_EQ(Client(plain).Info().status().code(), C::kUnavailable);
  absl::StatusOr<v1::InfoResponse> info = good.Info();
  EXPECT_TRUE(info->tls());
  EXPECT_TRUE(info->client_certificates());
  EXPECT_TRUE(info->tokens());
}

TEST_F(SecurityTest, MissingOrWrongTokenIsUnauthenticatedOnEveryMethod) {
  Start();
  const testing::Kv kv = SyntheticKv(20, kN, 1);
  for (const char* token : {"", "wrong-token-0123456789", "Bearer"}) {
    Client c(Options(token));
    const std::string what = absl::StrCat("token \"", token, "\"");
    v1::AppendChunk chunk = Chunk("s", kv, 20);
    EXPECT_EQ(c.Append({&chunk, 1}).status().code(), C::kUnauthenticated) << what;
    v1::AttendRequest attend;
    attend.add_items()->set_sequence_id("s");
    EXPECT_EQ(c.Attend(attend).status().code(), C::kUnauthenticated) << what;
    v1::ReadRequest read;
    read.set_sequence_id("s");
    EXPECT_EQ(c.Read(read).status().code(), C::kUnauthenticated) << what;
    EXPECT_EQ(c.Release("s").status().code(), C::kUnauthenticated) << what;
    EXPECT_EQ(c.Length("s").status().code(), C::kUnauthenticated) << what;
    EXPECT_EQ(c.Info().status().code(), C::kUnauthenticated) << what;
    absl::StatusOr<v1::StatsResponse> stats = c.Stats();
    EXPECT_EQ(stats.status().code(), C::kUnauthenticated) << what;
    EXPECT_FALSE(absl::StrContains(stats.status().message(), "wrong-token")) << stats.status();
  }
  Client alice(Options(kAliceToken));
  absl::StatusOr<v1::StatsResponse> stats = alice.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->sequences(), 0u);  // nothing got in
  EXPECT_EQ(stats->tokens_ingested(), 0u);
  EXPECT_EQ(stats->tenant(), "alice");
  // Three credentials x seven methods, each refused once, before any handler.
  const std::string metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(testing::MetricValue(metrics, "driftkv_unauthenticated_total"), 21) << metrics.substr(0, 300);
  EXPECT_EQ(testing::MetricValue(metrics, "driftkv_rejected_requests_total"), 0);
}

TEST_F(SecurityTest, TenantBCannotSeeReadAttendOrReleaseTenantAsSequence) {
  Start();
  Client alice(Options(kAliceToken)), bob(Options(kBobToken));
  const testing::Kv kv = SyntheticKv(70, kN, 2);
  v1::AppendChunk chunk = Chunk("prompt", kv, 70);
  ASSERT_TRUE(alice.Append({&chunk, 1}).ok());
  EXPECT_EQ(bob.Length("prompt").status().code(), C::kNotFound);
  v1::ReadRequest read;
  read.set_sequence_id("prompt");
  EXPECT_EQ(bob.Read(read).status().code(), C::kNotFound);
  v1::AttendRequest attend;
  v1::AttendItem* it = attend.add_items();
  it->set_sequence_id("prompt");
  it->set_dtype(v1::DTYPE_F32);
  it->set_q_heads(2);
  it->mutable_query()->assign(2 * 64 * sizeof(float), '\0');
  EXPECT_EQ(bob.Attend(attend).status().code(), C::kNotFound);
  EXPECT_EQ(bob.Release("prompt").status().code(), C::kNotFound);
  EXPECT_EQ(bob.Stats()->tenant_sequences(), 0u);
  // Alice's sequence is whole; Bob's Append to the name makes his own.
  ASSERT_TRUE(alice.Attend(attend).ok());
  EXPECT_EQ(alice.Length("prompt")->layers(0).tokens(), 70u);
  v1::AppendChunk small = Chunk("prompt", kv, 5);
  ASSERT_TRUE(bob.Append({&small, 1}).ok());
  EXPECT_EQ(bob.Length("prompt")->layers(0).tokens(), 5u);
  EXPECT_EQ(alice.Length("prompt")->layers(0).tokens(), 70u);
}

TEST_F(SecurityTest, TenantQuotaFromTheTokensFileIsResourceExhausted) {
  metrics_per_tenant_ = true;
  Start();
  Client bob(Options(kBobToken));
  const testing::Kv kv = SyntheticKv(10, kN, 3);
  v1::AppendChunk one = Chunk("one", kv, 10), two = Chunk("two", kv, 10);
  ASSERT_TRUE(bob.Append({&one, 1}).ok());
  absl::StatusOr<v1::AppendResponse> r = bob.Append({&two, 1});
  EXPECT_EQ(r.status().code(), C::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "tenant \"bob\" quota max_sequences 1")) << r.status();
  EXPECT_EQ(bob.Stats()->tenant_max_sequences(), 1u);
  Client alice(Options(kAliceToken));  // no quota
  EXPECT_TRUE(alice.Append({&one, 1}).ok());
  EXPECT_TRUE(alice.Append({&two, 1}).ok());
  const std::string metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(testing::MetricValue(metrics, "driftkv_tenant_sequences{tenant=\"bob\"}"), 1) << metrics;
  EXPECT_EQ(testing::MetricValue(metrics, "driftkv_tenant_sequences{tenant=\"alice\"}"), 2);
  EXPECT_EQ(testing::MetricValue(metrics, "driftkv_tenant_pages{tenant=\"alice\"}"), 0);
}

// A tenant's Stats holds its own figures and the pool's load, nothing that
// counts another tenant's activity (docs/api.md, "Info, Stats").
TEST_F(SecurityTest, StatsShowsNoOtherTenantsTombstonesReleasesOrSequences) {
  Start();
  Client alice(Options(kAliceToken)), bob(Options(kBobToken));
  const testing::Kv kv = SyntheticKv(70, kN, 5);
  v1::AppendChunk a1 = Chunk("a1", kv, 70), a2 = Chunk("a2", kv, 70), b = Chunk("b", kv, 10);
  ASSERT_TRUE(alice.Append({&a1, 1}).ok());
  ASSERT_TRUE(alice.Append({&a2, 1}).ok());
  ASSERT_TRUE(alice.Release("a1").ok());
  ASSERT_TRUE(bob.Append({&b, 1}).ok());
  absl::StatusOr<v1::StatsResponse> as = alice.Stats(), bs = bob.Stats();
  ASSERT_TRUE(as.ok() && bs.ok());
  EXPECT_EQ(as->tombstones(), 1u);
  EXPECT_EQ(as->sequences_released(), 1u);
  EXPECT_EQ(as->sequences(), 1u);
  EXPECT_EQ(bs->tombstones(), 0u);
  EXPECT_EQ(bs->sequences_released(), 0u);
  EXPECT_EQ(bs->sequences(), 1u);
  EXPECT_EQ(bs->tenant_sequences(), 1u);
  // Whole-server activity is the operator's (the metrics port), not a tenant's.
  for (const v1::StatsResponse* s : {&*as, &*bs}) {
    EXPECT_EQ(s->tokens_ingested(), 0u);
    EXPECT_EQ(s->bytes_ingested(), 0u);
    EXPECT_EQ(s->tokens_window(), 0u);
    EXPECT_EQ(s->symbols_key(), 0u);
    ASSERT_EQ(s->devices_size(), 1);
    EXPECT_EQ(s->devices(0).sequences(), 0u);
  }
  // The pool's load is the same figure for both.
  EXPECT_GT(bs->capacity_pages(), 0u);
  EXPECT_EQ(bs->capacity_pages(), as->capacity_pages());
  EXPECT_EQ(bs->pages_in_use(), as->pages_in_use());
  EXPECT_EQ(bs->devices(0).pages_in_use(), bs->pages_in_use());
}

// The metrics port has no authentication: by default no series names a
// tenant.
TEST_F(SecurityTest, MetricsNameNoTenantByDefault) {
  Start();
  Client alice(Options(kAliceToken)), bob(Options(kBobToken));
  const testing::Kv kv = SyntheticKv(70, kN, 6);
  v1::AppendChunk a = Chunk("a", kv, 70), b = Chunk("b", kv, 10);
  ASSERT_TRUE(alice.Append({&a, 1}).ok());
  ASSERT_TRUE(bob.Append({&b, 1}).ok());
  ASSERT_TRUE(alice.Release("a").ok());
  const std::string metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(absl::StrContains(metrics, "driftkv_sequences ")) << metrics.substr(0, 200);
  EXPECT_FALSE(absl::StrContains(metrics, "tenant")) << LinesWith(metrics, "tenant");
  EXPECT_FALSE(absl::StrContains(metrics, "alice")) << LinesWith(metrics, "alice");
  EXPECT_FALSE(absl::StrContains(metrics, "bob")) << LinesWith(metrics, "bob");
}

TEST_F(SecurityTest, HealthAndMetricsAreReachableWithoutAToken) {
  Start();
  ASSERT_GT(server_->health_port(), 0);
  auto plain = grpc::CreateChannel(testing::LoopbackTarget(server_->health_port()), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(plain);
  for (const char* service : {"", "driftkv.v1.KvCache"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = stub->Check(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  // With tokens on, health on the main port needs a token like every
  // service there.
  grpc::ChannelArguments args;
  auto tls = grpc::CreateCustomChannel(testing::LoopbackTarget(server_->port()),
                                       grpc::SslCredentials(grpc::SslCredentialsOptions{
                                           ReadAll(F("ca.pem")), ReadAll(F("client.key")), ReadAll(F("client.pem"))}),
                                       args);
  {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    EXPECT_EQ(grpc::health::v1::Health::NewStub(tls)->Check(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // The health port serves nothing else.
  ClientOptions o;
  o.target = testing::LoopbackTarget(server_->health_port());
  o.max_attempts = 1;
  EXPECT_EQ(Client(o).Info().status().code(), C::kUnimplemented);
  const std::string metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_TRUE(absl::StrContains(metrics, "driftkv_pool_capacity_pages")) << metrics.substr(0, 200);
}

TEST_F(SecurityTest, TlsWithoutClientCertificatesOrTokens) {
  Start(/*client_ca=*/false, /*tokens=*/false);
  Client c(Options("", ""));
  absl::StatusOr<v1::InfoResponse> info = c.Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->tls());
  EXPECT_FALSE(info->client_certificates());
  EXPECT_FALSE(info->tokens());
  const testing::Kv kv = SyntheticKv(10, kN, 4);
  v1::AppendChunk chunk = Chunk("s", kv, 10);
  EXPECT_TRUE(c.Append({&chunk, 1}).ok());
  EXPECT_EQ(c.Stats()->tenant(), "");
  // A client that does not trust the server's CA refuses it.
  ClientOptions rogue = Options("", "");
  rogue.tls_ca_file = F("rogue-ca.pem");
  EXPECT_EQ(Client(rogue).Info().status().code(), C::kUnavailable);
}

// Records what reaches it: whether each chunk carried a crc32c and whether
// it matched.
class RecordingService final : public v1::KvCache::Service {
 public:
  grpc::Status Append(grpc::ServerContext*, grpc::ServerReader<v1::AppendChunk>* reader, v1::AppendResponse*) override {
    v1::AppendChunk c;
    while (reader->Read(&c)) {
      absl::MutexLock lock(&mu);
      with_crc += c.has_crc32c() && c.crc32c() == ChunkCrc32c(c);
      ++chunks;
    }
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  int chunks = 0, with_crc = 0;
};

TEST(ClientChecksumTest, EveryChunkTheClientSendsCarriesItsCrc32c) {
  RecordingService service;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(port, 0);
  ClientOptions o;
  o.target = testing::LoopbackTarget(port);
  Client client(o);
  v1::AppendChunk bare;  // built by hand, no checksum
  bare.set_sequence_id("s");
  bare.set_keys("0123456789abcdef");
  bare.set_values("fedcba9876543210");
  const testing::Kv kv = SyntheticKv(4, kN, 5);
  const v1::AppendChunk made = MakeChunk("s", 0, 0, 4, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
  EXPECT_TRUE(made.has_crc32c());
  ASSERT_TRUE(client.Append({bare, made}).ok());
  std::unique_ptr<Client::AppendStream> stream = client.OpenAppend();
  ASSERT_TRUE(stream->Write(bare));
  ASSERT_TRUE(stream->Finish().ok());
  absl::MutexLock lock(&service.mu);
  EXPECT_EQ(service.chunks, 3);
  EXPECT_EQ(service.with_crc, 3);
  server->Shutdown();
}

TEST(SecurityConfigTest, TokensNeedTlsAndFilesMustBeReadable) {
  v1::ServerConfig c;
  c.mutable_model()->set_layers(2);
  c.mutable_model()->set_kv_heads(2);
  c.mutable_model()->set_head_dim(64);
  c.set_pool_bytes(1 << 20);
  ASSERT_TRUE(ResolveConfig(c).ok());
  EXPECT_EQ(ResolveConfig(c)->tombstone_seconds, 600.0);
  EXPECT_FALSE(ResolveConfig(c)->metrics_per_tenant);
  v1::ServerConfig per_tenant = c;
  per_tenant.set_metrics_per_tenant(true);
  EXPECT_TRUE(ResolveConfig(per_tenant)->metrics_per_tenant);
  v1::ServerConfig bad = c;
  bad.set_tokens_file("/nonexistent/tokens");
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(), "needs TLS")) << ResolveConfig(bad).status();
  bad = c;
  bad.set_tls_cert_file("/nonexistent/cert.pem");
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(), "set both")) << ResolveConfig(bad).status();
  bad.set_tls_key_file("/nonexistent/key.pem");
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(), "/nonexistent/cert.pem"));
  bad = c;
  bad.set_tls_client_ca_file("/x/ca.pem");
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(), "needs tls_cert_file"));
  bad = c;
  bad.set_tombstone_seconds(-1);
  EXPECT_TRUE(absl::StrContains(ResolveConfig(bad).status().message(), "tombstone_seconds -1"));
  // A client with a token but no TLS refuses to send it.
  ClientOptions o;
  o.token = "secret-token-0123456789";
  absl::StatusOr<v1::InfoResponse> info = Client(o).Info();
  EXPECT_EQ(info.status().code(), C::kInvalidArgument) << info.status();
  EXPECT_TRUE(absl::StrContains(info.status().message(), "needs TLS")) << info.status();
  std::unique_ptr<Client::AppendStream> stream = Client(o).OpenAppend();
  EXPECT_FALSE(stream->Write(v1::AppendChunk()));
  EXPECT_EQ(stream->Finish().status().code(), C::kInvalidArgument);
  ClientOptions missing;
  missing.tls_ca_file = "/nonexistent/ca.pem";
  info = Client(missing).Info();
  EXPECT_EQ(info.status().code(), C::kInvalidArgument) << info.status();
  EXPECT_TRUE(absl::StrContains(info.status().message(), "/nonexistent/ca.pem")) << info.status();
}

}  // namespace
}  // namespace driftkv
