// Shared pieces of the `driftkv` CLI (driftkv_main.cc for the one-RPC
// commands; bench.cc, demo.cc, fixture.cc for the workloads): flags,
// synthetic KV (eval/synthetic_kv.h), exact attention computed by the
// client, progress lines on a terminal, percentiles.
#ifndef DRIFTKV_CLI_CLI_H_
#define DRIFTKV_CLI_CLI_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "client/client.h"
#include "client/nccl_channel.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(double, timeout_s);
ABSL_DECLARE_FLAG(std::string, sequence);
ABSL_DECLARE_FLAG(int, tokens);
ABSL_DECLARE_FLAG(int, chunk_tokens);
ABSL_DECLARE_FLAG(int, q_heads);
ABSL_DECLARE_FLAG(uint32_t, seed);
ABSL_DECLARE_FLAG(std::string, metrics_url);
ABSL_DECLARE_FLAG(int, streams);
ABSL_DECLARE_FLAG(int, steps);
ABSL_DECLARE_FLAG(std::string, servers);
ABSL_DECLARE_FLAG(uint64_t, count);

namespace driftkv {
namespace cli {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t);

ClientOptions OptionsFromFlags();

// Prints "driftkv: CODE: message" on stderr; returns 1 (the exit code).
int Fail(const absl::Status& st);

// A decode step: append (key, value) at `index` and attend with q, bf16.
v1::AttendItem StepItem(const std::string& seq, uint32_t layer, const float* key, const float* value, size_t n,
                        uint64_t index, const std::vector<float>& q, int q_heads);

// Rounds through bf16, as the queries and steps travel.
std::vector<float> Bf16(const float* x, size_t count);

// Synthetic keys/values of one layer, [tokens][kv_heads][head_dim]: kind
// "llm" of the synthetic generator (eval/synthetic_kv.h; per-channel key
// means, outlier channels, uneven token norms, RoPE, heavy-tailed values).
void SyntheticLayer(int tokens, int kv_heads, int head_dim, uint32_t seed, std::vector<float>* keys,
                    std::vector<float>* values);
// A query [q_heads][head_dim] that attends sharply to a few earlier tokens
// (it is a scaled copy of one past key plus noise), like a real decode query.
std::vector<float> SyntheticQuery(const std::vector<float>& keys, int tokens, int kv_heads, int head_dim, int q_heads,
                                  uint32_t seed);

// Exact float64 attention of one query over keys/values [0, tokens),
// accumulated as sum (o - ref)^2 and sum ref^2 (the codec eval's attn_rel_err).
void AccumulateError(const std::vector<float>& out, const float* keys, const float* values, int64_t tokens,
                     int kv_heads, int head_dim, const float* query, int q_heads, double scale, double* err,
                     double* sum);

// "\r<label> 45% ..." on stderr when it is a terminal; a newline at done.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  void Update(int64_t done);
  void Done();

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  int last_percent_ = -1;
};

// The q-th quantile (0..1) of `v` (sorted in place).
double Quantile(std::vector<double>* v, double q);

// `push --transport nccl` (push_nccl.cc): one layer's float tokens, as
// `dtype`, to this process's current GPU and over `channel` in chunks of
// `chunk` tokens.
absl::StatusOr<v1::AppendResponse> PushLayerNccl(NcclChannel* channel, const std::string& sequence, uint32_t layer,
                                                 int tokens, int chunk, size_t n, v1::DType dtype, const float* keys,
                                                 const float* values);
// token-hash: the tokens_file line of the token on stdin (service/tokens.h; wire/sha256.h).
int TokenHash(const std::string& tenant);

// The prompt's token ids from --token_ids (a comma list) or
// --token_ids_file; with neither, an empty list unless `required`.
absl::StatusOr<std::vector<uint32_t>> TokenIdsFromFlags(bool required);

// The prefix-cache commands (prefix.cc): lookup prints the pages held per
// layer and the first miss's reason; pin and unpin; watch prints a line
// per page event until --count events or SIGINT/SIGTERM.
int Lookup(Client& client, const v1::InfoResponse& info);
int Pin(Client& client);
// Creates `sequence_id` from --from (and --fork_tokens) or from the prefix
// index by the token ids (at most --max_tokens).
int Fork(Client& client, const std::string& sequence_id);
int Unpin(Client& client);
int Watch(Client& client);

int Bench(Client& client);
int Demo(Client& client);
int Fixture(Client& client);

}  // namespace cli
}  // namespace driftkv

#endif  // DRIFTKV_CLI_CLI_H_
