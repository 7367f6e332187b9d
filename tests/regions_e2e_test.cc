// Memory regions over a real in-process server with TLS and two tenants'
// tokens: a HostRegion shares pages with the server and belongs to its
// tenant only; the region socket refuses descriptors it cannot trust
// (not a memfd, not sealed against shrinking, a wrong request); an attach
// token registers once; and a client process that dies without
// unregistering (tests/region_client_helper) leaves nothing mapped once
// its lease has run out.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/regions.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "service/tokens.h"
#include "tests/service_test_util.h"
#include "wire/fd_socket.h"

namespace driftkv {
namespace {

using C = absl::StatusCode;

const char kAliceToken[] = "alice-0123456789abcdef0123456789abcdef";
const char kBobToken[] = "bob-fedcba9876543210fedcba9876543210";

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A CA and a server certificate for 127.0.0.1 (tokens need TLS).
bool MintPki(const std::string& d) {
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

class RegionsE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(Dir() + "/regions-pki");
    ASSERT_EQ(std::system(("mkdir -p " + *dir_).c_str()), 0);
    ASSERT_TRUE(MintPki(*dir_));
    WriteText(*dir_ + "/tokens", absl::StrCat(Sha256Hex(kAliceToken), " alice\n", Sha256Hex(kBobToken), " bob\n"));
  }
  void SetUp() override {
    ServiceOptions o = testing::SmallOptions();
    o.tls_cert_file = *dir_ + "/server.pem";
    o.tls_key_file = *dir_ + "/server.key";
    absl::StatusOr<TokenTable> t = TokenTable::ReadFile(*dir_ + "/tokens");
    ASSERT_TRUE(t.ok()) << t.status();
    o.tokens = std::make_shared<const TokenTable>(*std::move(t));
    // sun_path holds 107 bytes: TEST_TMPDIR may be longer.
    // Tests running at once share /tmp, each in a PID namespace of its own
    // where the pid is the same: a random name.
    std::random_device rd;
    socket_ = absl::StrCat("/tmp/driftkv-regions-test-", absl::Hex(uint64_t{rd()} << 32 | rd()), ".sock");
    o.region_socket = socket_;
    absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    alice_ = std::make_unique<Client>(Options(kAliceToken));
    bob_ = std::make_unique<Client>(Options(kBobToken));
  }
  void TearDown() override {
    alice_.reset();
    bob_.reset();
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    EXPECT_NE(access(socket_.c_str(), F_OK), 0) << "the socket file outlived the server";
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
  v1::StatsResponse Stats(Client& c) {
    absl::StatusOr<v1::StatsResponse> s = c.Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::StatsResponse();
  }
  // The region table's whole-server figures, which a tenant's Stats does
  // not show.
  v1::StatsResponse ServerStats() {
    v1::StatsResponse s;
    server_->regions().Stats(&s, "");
    return s;
  }

  static std::string* dir_;
  std::string socket_;
  std::unique_ptr<DriftkvServer> server_;
  std::unique_ptr<Client> alice_, bob_;
};
std::string* RegionsE2eTest::dir_ = nullptr;

TEST_F(RegionsE2eTest, HostRegionSharesPagesWithTheServerAndBelongsToItsTenant) {
  absl::StatusOr<v1::InfoResponse> info = alice_->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->region_socket(), socket_);
  HostRegionOptions ro;
  ro.name = "alice-queries";
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(alice_.get(), 1 << 16, ro);
  ASSERT_TRUE(region.ok()) << region.status();
  HostRegion& r = **region;
  EXPECT_NE(r.id(), 0u);
  EXPECT_EQ(r.size(), 1u << 16);
  EXPECT_EQ(r.lease_seconds(), kDefaultRegionLeaseSeconds);

  // The client writes, the server reads the same bytes; and back.
  std::memset(r.data(), 'q', r.size());
  absl::StatusOr<RegionView> view = server_->regions().Resolve("alice", r.Ref(1024), 4096, 4, "items[0].query_ref");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(std::string(static_cast<char*>(view->data), 4096), std::string(4096, 'q'));
  std::memset(view->data, 'o', 16);
  EXPECT_EQ(std::string(static_cast<char*>(r.data()) + 1024, 16), std::string(16, 'o'));
  view = absl::CancelledError("dropped");

  // Bob: every answer is that of an id never issued.
  const uint64_t never = r.id() ^ 0x8000;
  for (uint64_t id : {r.id(), never}) {
    absl::Status st = UnregisterRegion(bob_.get(), id);
    EXPECT_EQ(st.code(), C::kNotFound);
    EXPECT_EQ(st.message(), absl::StrCat("region_id ", id, " not found"));
    absl::Status resolve = server_->regions().Resolve("bob", r.Ref(0), 4, 4, "items[3].query_ref").status();
    EXPECT_EQ(resolve.code(), C::kNotFound);
  }
  const uint64_t ids[1] = {r.id()};
  absl::StatusOr<v1::RenewRegionsResponse> renewed = RenewRegions(bob_.get(), ids);
  ASSERT_TRUE(renewed.ok());
  ASSERT_EQ(renewed->unknown_region_ids_size(), 1);
  EXPECT_TRUE(r.Renew().ok());
  EXPECT_EQ(Stats(*alice_).tenant_regions(), 1u);
  EXPECT_EQ(Stats(*alice_).tenant_region_bytes(), 1u << 16);
  EXPECT_EQ(Stats(*bob_).tenant_regions(), 0u);
  EXPECT_EQ(Stats(*bob_).regions(), 0u);  // alice's region is not bob's business
  EXPECT_EQ(ServerStats().regions(), 1u);

  region->reset();  // unregisters
  EXPECT_EQ(Stats(*alice_).tenant_regions(), 0u);
  EXPECT_EQ(ServerStats().regions(), 0u);
}

TEST_F(RegionsE2eTest, TheSocketRefusesDescriptorsItCannotTrust) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  absl::StatusOr<AttachReply> reply = AttachFd(socket_, p[0], absl::Seconds(5));
  EXPECT_EQ(reply.status().code(), C::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(reply.status().message(), "not a memfd")) << reply.status();
  close(p[0]);
  close(p[1]);

  const std::string file = Dir() + "/plain-file";
  WriteText(file, std::string(4096, 'x'));
  const int plain = open(file.c_str(), O_RDWR);
  ASSERT_GE(plain, 0);
  reply = AttachFd(socket_, plain, absl::Seconds(5));
  // On tmpfs a plain file answers F_GET_SEALS with F_SEAL_SEAL only (so it
  // can never be sealed against shrinking); elsewhere it has no seals.
  EXPECT_EQ(reply.status().code(), C::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(reply.status().message(), "not a memfd") ||
              absl::StrContains(reply.status().message(), "not sealed with F_SEAL_SHRINK"))
      << reply.status();
  close(plain);

  const int unsealed = memfd_create("unsealed", MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  reply = AttachFd(socket_, unsealed, absl::Seconds(5));
  EXPECT_EQ(reply.status().code(), C::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(reply.status().message(), "not sealed with F_SEAL_SHRINK")) << reply.status();
  close(unsealed);

  absl::StatusOr<int> huge = CreateSealedMemfd("huge", kDefaultMaxRegionBytes + 4096);
  ASSERT_TRUE(huge.ok());
  reply = AttachFd(socket_, *huge, absl::Seconds(5));
  EXPECT_TRUE(absl::StrContains(reply.status().message(), "max_region_bytes")) << reply.status();
  close(*huge);

  // A request that is not the protocol's, with a good memfd.
  absl::StatusOr<int> good = CreateSealedMemfd("good", 4096);
  ASSERT_TRUE(good.ok());
  const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket_.c_str());
  ASSERT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_TRUE(SendWithFd(sock, "DKVRGN99", *good).ok());
  char buf[600];
  const ssize_t n = recv(sock, buf, sizeof(buf), MSG_WAITALL);
  ASSERT_GT(n, 0);
  absl::StatusOr<AttachReply> parsed = ParseAttachReply(absl::string_view(buf, n));
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->ok);
  EXPECT_TRUE(absl::StrContains(parsed->error, "not \"DKVRGN01\"")) << parsed->error;
  close(sock);
  close(*good);
  EXPECT_EQ(ServerStats().regions(), 0u);
}

TEST_F(RegionsE2eTest, AnAttachTokenRegistersOnce) {
  absl::StatusOr<int> fd = CreateSealedMemfd("once", 4096);
  ASSERT_TRUE(fd.ok());
  absl::StatusOr<AttachReply> reply = AttachFd(socket_, *fd, absl::Seconds(5));
  close(*fd);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->size, 4096u);
  v1::RegisterRegionRequest request;
  request.set_kind(v1::REGION_HOST_SHM);
  request.set_attach_token(reply->token);
  absl::StatusOr<v1::RegisterRegionResponse> first = RegisterRegion(alice_.get(), request);
  ASSERT_TRUE(first.ok()) << first.status();
  // Neither the same tenant nor another can use it again.
  for (Client* c : {alice_.get(), bob_.get()}) {
    absl::StatusOr<v1::RegisterRegionResponse> again = RegisterRegion(c, request);
    EXPECT_EQ(again.status().code(), C::kNotFound);
    EXPECT_EQ(again.status().message(), "attach_token unknown, used already or expired");
  }
  EXPECT_TRUE(UnregisterRegion(alice_.get(), first->region_id()).ok());
}

TEST_F(RegionsE2eTest, AClientThatDiesLeavesNothingAfterItsLease) {
  const std::string helper =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/tests/region_client_helper");
  const std::string out = Dir() + "/helper.out";
  const std::string cmd = absl::StrCat(helper, " 127.0.0.1:", server_->port(), " ", *dir_, "/ca.pem ", kAliceToken,
                                       " 1 driftkv-dead-client > ", out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  uint64_t id = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadAll(out)), &id)) << ReadAll(out);
  // The process is gone; the server still maps what it wrote.
  EXPECT_TRUE(absl::StrContains(ReadAll("/proc/self/maps"), "memfd:driftkv-dead-client"));
  absl::StatusOr<RegionView> view = server_->regions().Resolve(
      "alice",
      [&] {
        v1::TensorRef ref;
        ref.set_region_id(id);
        return ref;
      }(),
      8192, 1, "f");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(std::string(static_cast<char*>(view->data), 8192), std::string(8192, 'K'));
  view = absl::CancelledError("dropped");
  // The reaper unregisters it after its 1 s lease (checks once a second).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (Stats(*alice_).tenant_regions() != 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Stats(*alice_).tenant_regions(), 0u);
  EXPECT_EQ(ServerStats().regions_expired(), 1u);
  EXPECT_FALSE(absl::StrContains(ReadAll("/proc/self/maps"), "memfd:driftkv-dead-client"));
}

}  // namespace
}  // namespace driftkv
