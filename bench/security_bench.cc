// The cost of the integrity checks and of transport security, on the CPU:
//   crc32c     Crc32c over a 64 MiB buffer (what the server checks per
//              chunk and the C++ client computes in MakeChunk), GB/s;
//   digest     TokenDigest of one token of 8 KV heads x 128 (what encoding
//              a page adds per token), ns per token;
//   repeat     Handler::Append of chunks already stored (every token compared
//              with the window or its digest) vs their first Append;
//   transport  over loopback, an in-process server: Info round trips and a
//              1 MiB Append chunk (a duplicate after the first) with
//              plaintext, TLS, and mTLS + bearer token (certificates minted
//              with openssl into $TMPDIR).
//
//   security_bench [--reps=N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/check.h"
#include "client/client.h"
#include "service/process_env.h"
#include "service/server.h"
#include "service/token_digest.h"
#include "service/tokens.h"
#include "wire/crc32c.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

ServiceOptions Options() {
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.layers = 1;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.pool_bytes = 256ull << 20;
  o.backend_threads = 1;
  return o;
}

std::vector<float> Random(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(count);
  for (float& v : x) v = g(rng);
  return x;
}

void Crc(int reps) {
  std::string buf(64u << 20, '\0');
  std::mt19937 rng(1);
  for (char& c : buf) c = static_cast<char>(rng());
  std::vector<double> t;
  uint32_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    sink ^= Crc32c(buf);
    t.push_back(Seconds(t0));
  }
  std::printf("crc32c     64 MiB: median %.2f ms = %.2f GB/s (checksum %08x)\n", 1e3 * Median(t),
              buf.size() / Median(t) / 1e9, sink);
}

void Digest(int reps) {
  const int tokens = 100000;
  std::vector<uint16_t> k(static_cast<size_t>(tokens) * kN), v(k.size());
  std::mt19937 rng(2);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(rng());
    v[i] = static_cast<uint16_t>(rng());
  }
  std::vector<double> t;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < tokens; ++i) sink ^= TokenDigest(&k[i * size_t{kN}], &v[i * size_t{kN}], kN);
    t.push_back(Seconds(t0));
  }
  std::printf("digest     %d tokens of %d values: median %.1f ns per token (%016llx)\n", tokens, kN,
              1e9 * Median(t) / tokens, static_cast<unsigned long long>(sink));
}

std::vector<v1::AppendChunk> Chunks(const std::string& id, int tokens, int per_chunk) {
  const std::vector<float> k = Random(static_cast<size_t>(tokens) * kN, 3), v = Random(k.size(), 4);
  std::vector<v1::AppendChunk> out;
  for (int t = 0; t < tokens; t += per_chunk) {
    out.push_back(
        MakeChunk(id, 0, t, per_chunk, k.data() + size_t{kN} * t, v.data() + size_t{kN} * t, kN, v1::DTYPE_BF16));
  }
  return out;
}

void Repeat(int reps) {
  Metrics metrics;
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(Options(), &metrics);
  CHECK_OK(h.status());
  const int tokens = 2048;
  const std::vector<v1::AppendChunk> chunks = Chunks("r", tokens, 256);
  v1::AppendResponse r;
  auto t0 = Clock::now();
  for (const v1::AppendChunk& c : chunks) CHECK_OK((*h)->Append(c, &r));
  const double first = Seconds(t0);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    t0 = Clock::now();
    for (const v1::AppendChunk& c : chunks) CHECK_OK((*h)->Append(c, &r));
    t.push_back(Seconds(t0));
  }
  std::printf(
      "repeat     %d tokens of %d values in chunks of 256 (bf16, crc32c set): first Append %.1f ms "
      "(%.2f us/token, encoding included); repeated, all compared: median %.2f ms (%.2f us/token)\n",
      tokens, kN, 1e3 * first, 1e6 * first / tokens, 1e3 * Median(t), 1e6 * Median(t) / tokens);
}

bool Sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
}

void TransportCost(int reps) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string d = absl::StrCat(tmp ? tmp : "/tmp", "/driftkv-security-bench");
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::ofstream(d + ".ext") << "subjectAltName=IP:127.0.0.1\n";
  const bool ok =
      Sh("mkdir -p " + d) &&
      Sh(absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/ca.key -out ", d, "/ca.pem -days 1 -subj /CN=ca")) &&
      Sh(absl::StrCat("openssl req ", key, " -keyout ", d, "/s.key -out ", d, "/s.csr -subj /CN=s")) &&
      Sh(absl::StrCat("openssl x509 -req -in ", d, "/s.csr -CA ", d, "/ca.pem -CAkey ", d,
                      "/ca.key -CAcreateserial -days 1 -extfile ", d, ".ext -out ", d, "/s.pem")) &&
      Sh(absl::StrCat("openssl req ", key, " -keyout ", d, "/c.key -out ", d, "/c.csr -subj /CN=c")) &&
      Sh(absl::StrCat("openssl x509 -req -in ", d, "/c.csr -CA ", d, "/ca.pem -CAkey ", d,
                      "/ca.key -CAcreateserial -days 1 -out ", d, "/c.pem"));
  if (!ok) {
    std::fprintf(stderr, "openssl failed: cannot mint certificates in %s\n", d.c_str());
    std::exit(1);
  }
  const std::string token = "bench-token-0123456789abcdef";
  std::ofstream(d + "/tokens") << Sha256Hex(token) << " bench\n";
  const std::vector<v1::AppendChunk> chunk = Chunks("t", 512, 512);  // 512 x 1024 x 2 x 2 bytes = 2 MiB
  for (const char* mode : {"plaintext", "TLS", "mTLS+token"}) {
    ServiceOptions o = Options();
    ClientOptions co;
    co.timeout = absl::Seconds(30);
    if (!absl::StrContains(mode, "plain")) {
      o.tls_cert_file = d + "/s.pem";
      o.tls_key_file = d + "/s.key";
      co.tls_ca_file = d + "/ca.pem";
    }
    if (absl::StrContains(mode, "mTLS")) {
      o.tls_client_ca_file = d + "/ca.pem";
      absl::StatusOr<TokenTable> t = TokenTable::ReadFile(d + "/tokens");
      CHECK_OK(t.status());
      o.tokens = std::make_shared<const TokenTable>(*std::move(t));
      co.tls_cert_file = d + "/c.pem";
      co.tls_key_file = d + "/c.key";
      co.token = token;
    }
    absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o);
    CHECK_OK(s.status());
    co.target = absl::StrCat("127.0.0.1:", (*s)->port());
    Client client(co);
    CHECK_OK(client.Info().status());  // connects (the handshake is not timed)
    std::vector<double> info, append;
    CHECK_OK(client.Append(chunk).status());
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      CHECK_OK(client.Info().status());
      info.push_back(Seconds(t0));
      if (i % 10 == 0) {
        t0 = Clock::now();
        CHECK_OK(client.Append(chunk).status());
        append.push_back(Seconds(t0));
      }
    }
    std::printf("transport  %-10s Info median %.0f us; Append of a 2 MiB chunk (duplicate) median %.2f ms\n", mode,
                1e6 * Median(info), 1e3 * Median(append));
    (*s)->Shutdown(absl::Seconds(1));
  }
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  driftkv::PrepareServerProcess();  // its servers run in this process, set up as driftkv-server's
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--reps=") && absl::SimpleAtoi(argv[i] + 7, &reps)) continue;
    std::fprintf(stderr, "usage: security_bench [--reps=N]\n");
    return 2;
  }
  driftkv::Crc(9);
  driftkv::Digest(5);
  driftkv::Repeat(5);
  driftkv::TransportCost(reps);
  return 0;
}
