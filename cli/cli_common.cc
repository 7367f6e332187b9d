// The shared pieces of the `driftkv` CLI (cli.h).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "client/sharded_client.h"
#include "codec/compressed_attention.h"
#include "eval/synthetic_kv.h"
#include "wire/half.h"
#include "wire/sha256.h"
#include "wire/tenant_name.h"
#include "wire/tensor.h"

ABSL_FLAG(double, query_focus, 0.25, "synthetic queries: weight of the past key they copy (higher: sharper attention)");
ABSL_FLAG(int, streams, 4, "bench/demo/push: concurrent Append calls per sequence (layers split between them)");
ABSL_FLAG(int, steps, 32, "bench/demo: decode steps per sequence");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of the CA that signed the server's certificate; set: TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mTLS), with --tls_key");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "", "name expected in the server's certificate (default: --server's host)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token (not the token itself: command lines are visible to other users); "
          "also $DRIFTKV_TOKEN_FILE");

namespace driftkv {
namespace cli {

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

ClientOptions OptionsFromFlags() {
  ClientOptions o;
  o.target = absl::GetFlag(FLAGS_server);
  // bench --servers a,b,c: the first replica answers the CLI's own Info.
  const std::vector<std::string> replicas = SplitReplicas(absl::GetFlag(FLAGS_servers));
  if (!replicas.empty()) o.target = replicas[0];
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  o.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (token_file.empty() && std::getenv("DRIFTKV_TOKEN_FILE") != nullptr)
    token_file = std::getenv("DRIFTKV_TOKEN_FILE");
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    std::stringstream text;
    if (in) text << in.rdbuf();
    // An unreadable file leaves a token that no server accepts, so the
    // first call fails (UNAUTHENTICATED) rather than going out without one.
    o.token = in ? std::string(absl::StripAsciiWhitespace(text.str())) : std::string("unreadable:") + token_file;
  }
  return o;
}

int TokenHash(const std::string& tenant) {
  if (absl::Status st = CheckTenantName(tenant); !st.ok()) return Fail(st);
  std::stringstream text;
  text << std::cin.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.size() < 16) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "the token on stdin has ", token.size(), " bytes; use at least 16 random bytes (openssl rand -hex 32)")));
  }
  std::printf("%s %s\n", Sha256Hex(token).c_str(), tenant.c_str());
  return 0;
}

void SyntheticLayer(int tokens, int kv_heads, int head_dim, uint32_t seed, std::vector<float>* keys,
                    std::vector<float>* values) {
  SynthKv kv = SynthLayer(tokens, kv_heads, head_dim, seed);
  *keys = std::move(kv.keys);
  *values = std::move(kv.values);
}

std::vector<float> SyntheticQuery(const std::vector<float>& keys, int tokens, int kv_heads, int head_dim, int q_heads,
                                  uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, tokens - 1);
  const int n = kv_heads * head_dim, group = q_heads / kv_heads;
  std::vector<float> q(static_cast<size_t>(q_heads) * head_dim);
  for (int h = 0; h < q_heads; ++h) {
    const float* k = keys.data() + static_cast<size_t>(pick(rng)) * n + (h / group) * head_dim;
    const float focus = static_cast<float>(absl::GetFlag(FLAGS_query_focus));
    for (int j = 0; j < head_dim; ++j) q[h * head_dim + j] = focus * k[j] + g(rng);
  }
  return q;
}

void AccumulateError(const std::vector<float>& out, const float* keys, const float* values, int64_t tokens,
                     int kv_heads, int head_dim, const float* query, int q_heads, double scale, double* err,
                     double* sum) {
  std::vector<double> ref(static_cast<size_t>(q_heads) * head_dim), lse(q_heads);
  ReferenceAttention(keys, values, tokens, kv_heads, head_dim, query, q_heads, scale, ref.data(), lse.data());
  for (size_t i = 0; i < ref.size(); ++i) {
    *err += (out[i] - ref[i]) * (out[i] - ref[i]);
    *sum += ref[i] * ref[i];
  }
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), tty_(isatty(2) != 0) {}

void Progress::Update(int64_t done) {
  if (!tty_) return;
  const int p = static_cast<int>(100 * done / total_);
  if (p == last_percent_) return;
  last_percent_ = p;
  std::fprintf(stderr, "\r%s %3d%% (%lld/%lld)", label_.c_str(), p, static_cast<long long>(done),
               static_cast<long long>(total_));
}

void Progress::Done() {
  if (tty_ && last_percent_ >= 0) std::fprintf(stderr, "\n");
}

double Quantile(std::vector<double>* v, double q) {
  if (v->empty()) return 0;
  std::sort(v->begin(), v->end());
  const size_t i = std::min(v->size() - 1, static_cast<size_t>(std::ceil(q * v->size())) - (q > 0 ? 1 : 0));
  return (*v)[i];
}

int Fail(const absl::Status& st) {
  std::cerr << "driftkv: " << absl::StatusCodeToString(st.code()) << ": " << st.message() << "\n";
  return 1;
}

v1::AttendItem StepItem(const std::string& seq, uint32_t layer, const float* key, const float* value, size_t n,
                        uint64_t index, const std::vector<float>& q, int q_heads) {
  v1::AttendItem it;
  it.set_sequence_id(seq);
  it.set_layer(layer);
  it.set_dtype(v1::DTYPE_BF16);
  it.set_q_heads(q_heads);
  FloatToTensor(q.data(), q.size(), v1::DTYPE_BF16, it.mutable_query());
  FloatToTensor(key, n, v1::DTYPE_BF16, it.mutable_new_key());
  FloatToTensor(value, n, v1::DTYPE_BF16, it.mutable_new_value());
  it.set_new_token_index(index);
  return it;
}

// Rounds through bf16, as the queries and steps travel.
std::vector<float> Bf16(const float* x, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(FloatToBf16(x[i]));
  return out;
}

}  // namespace cli
}  // namespace driftkv
