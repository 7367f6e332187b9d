// driftkv: command-line client of driftkv-server.
//
//   driftkv [--server HOST:PORT] COMMAND [flags]
//   push     --sequence S (--synthetic --tokens T | --keys F --values F) [--layers L]
//            [--new_incarnation] (reuse an id released less than tombstone_seconds ago)
//            [--token_ids L | --token_ids_file F]: one id per token, so that the
//            sequence's full pages enter the prefix index (docs/prefix_cache.md)
//            F holds [layers][T][kv_heads][head_dim] (all layers, layer-major) or,
//            when it contains "{layer}", one [T][kv_heads][head_dim] file per layer;
//            --file_dtype fp16|bf16|f32, --skip_bytes to start inside a file;
//            --transport nccl [--cuda_device D]: from GPU D over an NCCL channel
//            (docs/nccl.md) instead of gRPC Append
//   attend   --sequence S --layer L (--queries F [Q][q_heads][head_dim] f32 | --synthetic)
//            [--q_heads Q] [--out F]: prints the output norm and lse per query
//   read     --sequence S --layer L [--first N] [--count N] --out_keys F --out_values F (f32)
//   release  --sequence S
//   length   --sequence S: tokens of every layer (compressed + bf16 window)
//   stats    model shape, codec, capacity and usage
//   lookup   (--token_ids 1,2,3 | --token_ids_file F): the prompt's pages the
//            prefix index holds, per layer and in every layer, and why the
//            next one is not held
//   pin      --pin_id P (--token_ids L | --token_ids_file F) [--ttl_s S]
//            [--max_tokens N]: keeps that prefix resident for the lease
//   fork     --sequence NEW (--from SRC --fork_tokens N | --token_ids L |
//            --token_ids_file F [--max_tokens N]): NEW shares SRC's first N
//            tokens, or the longest prefix of the prompt the prefix index
//            holds; prints the tokens shared (append from there)
//   unpin    --pin_id P
//   watch    [--count N] [--max_batch B] [--buffer_events E]: a line per page
//            stored in or evicted from the prefix index ("stored KEYHEX layer
//            L"; "dropped N" when the server dropped events), until N events
//            or SIGINT/SIGTERM (exit status 0 either way)
//   bench    --sequences N --tokens T --steps S [--servers A,B,C]: ingest and Attend
//            throughput (over several replicas: sequences spread by rendezvous hashing)
//   demo     pushes a synthetic context, attends decode steps, compares with
//            exact attention, prints compression, error, throughput
//   token-hash --tenant NAME: reads a bearer token on stdin and prints its
//            tokens_file line "SHA256HEX NAME" (no server needed)
//   fixture  --fixture PREFIX: the same with real keys/values/queries
//            (e.g. ../shared/eval/fixture_public.{k,v,q}.bin)
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "cli/cli.h"
#include "wire/tensor.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "driftkv-server address");
ABSL_FLAG(double, timeout_s, 60.0, "deadline of each RPC attempt, seconds");
ABSL_FLAG(std::string, sequence, "seq0", "sequence id");
ABSL_FLAG(int, tokens, 1024, "tokens per layer (synthetic push, bench, demo)");
ABSL_FLAG(int, chunk_tokens, 256, "tokens per Append chunk");
ABSL_FLAG(std::string, transport, "grpc", "push: grpc (Append) or nccl (GPU to GPU, docs/nccl.md)");
ABSL_FLAG(int, cuda_device, 0, "push --transport nccl: this process's CUDA device");
ABSL_FLAG(int, q_heads, 0, "query heads (0: 2 x kv_heads)");
ABSL_FLAG(uint32_t, seed, 1, "seed of synthetic data");
ABSL_FLAG(std::string, metrics_url, "http://127.0.0.1:9464/metrics", "printed by demo");
ABSL_FLAG(bool, synthetic, false, "push/attend synthetic data");
ABSL_FLAG(std::string, keys, "", "push: key file");
ABSL_FLAG(std::string, values, "", "push: value file");
ABSL_FLAG(std::string, file_dtype, "fp16", "push: element type of the files (fp16, bf16, f32)");
ABSL_FLAG(int64_t, skip_bytes, 0, "push: bytes to skip at the start of each file");
ABSL_FLAG(int, layers, 0, "push: layers to push (0: all of the server's)");
ABSL_FLAG(int, layer, 0, "attend/read: layer");
ABSL_FLAG(std::string, queries, "", "attend: f32 query file [Q][q_heads][head_dim]");
ABSL_FLAG(std::string, out, "", "attend: f32 output file [Q][q_heads][head_dim]");
ABSL_FLAG(uint64_t, first, 0, "read: first token");
ABSL_FLAG(uint64_t, count, 0, "read: tokens (0: to the end); watch: events to print (0: until interrupted)");
ABSL_FLAG(std::string, out_keys, "", "read: f32 key file");
ABSL_FLAG(std::string, out_values, "", "read: f32 value file");
ABSL_FLAG(std::string, tenant, "", "token-hash: the tenant the token acts for");
ABSL_FLAG(bool, new_incarnation, false,
          "push: start a new sequence under an id released less than tombstone_seconds ago");

namespace driftkv {
namespace cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t skip, int64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  in.seekg(skip);
  std::string data(bytes, '\0');
  in.read(data.data(), bytes);
  if (in.gcount() != bytes) {
    return absl::OutOfRangeError(absl::StrCat(path, " holds fewer than ", skip + bytes, " bytes (needed ", bytes,
                                              " after skipping ", skip, ")"));
  }
  return data;
}

absl::Status WriteFile(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), bytes);
  return out ? absl::OkStatus() : absl::UnavailableError(absl::StrCat("cannot write ", path));
}

int Push(Client& client, const v1::InfoResponse& info) {
  const int layers = absl::GetFlag(FLAGS_layers) > 0 ? absl::GetFlag(FLAGS_layers) : info.layers();
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const size_t n = static_cast<size_t>(info.kv_heads()) * info.head_dim();
  const std::string seq = absl::GetFlag(FLAGS_sequence);
  const int chunk = absl::GetFlag(FLAGS_chunk_tokens);
  v1::DType dtype = v1::DTYPE_BF16;
  const std::string fd = absl::GetFlag(FLAGS_file_dtype);
  if (fd == "fp16")
    dtype = v1::DTYPE_FP16;
  else if (fd == "f32")
    dtype = v1::DTYPE_F32;
  else if (fd != "bf16")
    return Fail(absl::InvalidArgumentError(absl::StrCat("--file_dtype ", fd, " is not fp16, bf16 or f32")));
  const bool synthetic = absl::GetFlag(FLAGS_synthetic);
  if (!synthetic && (absl::GetFlag(FLAGS_keys).empty() || absl::GetFlag(FLAGS_values).empty())) {
    return Fail(absl::InvalidArgumentError("push needs --synthetic or --keys and --values"));
  }
  const int64_t layer_bytes = static_cast<int64_t>(tokens) * n * DTypeBytes(dtype);
  const std::string transport = absl::GetFlag(FLAGS_transport);
  absl::StatusOr<std::vector<uint32_t>> ids = TokenIdsFromFlags(false);
  if (!ids.ok()) return Fail(ids.status());
  if (!ids->empty() && ids->size() != static_cast<size_t>(tokens)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("push has ", ids->size(), " token ids for --tokens ", tokens, "; give one id per token")));
  }
  if (!ids->empty() && transport != "grpc") {
    return Fail(absl::InvalidArgumentError("token ids travel with gRPC Append only; push them with --transport grpc"));
  }
  std::unique_ptr<NcclChannel> channel;
  if (transport == "nccl") {
    absl::StatusOr<std::unique_ptr<NcclChannel>> ch = NcclChannel::Open(&client, absl::GetFlag(FLAGS_cuda_device));
    if (!ch.ok()) return Fail(ch.status());
    channel = *std::move(ch);
  } else if (transport != "grpc") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--transport ", transport, " is not grpc or nccl")));
  }
  Progress progress("push", static_cast<int64_t>(layers) * tokens);
  const auto start = std::chrono::steady_clock::now();
  uint64_t stored = 0, duplicate = 0;
  for (int l = 0; l < layers; ++l) {
    std::vector<float> keys(tokens * n), values(tokens * n);
    if (synthetic) {
      SyntheticLayer(tokens, info.kv_heads(), info.head_dim(), absl::GetFlag(FLAGS_seed) * 1000 + l, &keys, &values);
    } else {
      std::string paths[2] = {absl::GetFlag(FLAGS_keys), absl::GetFlag(FLAGS_values)};
      int64_t offset = absl::GetFlag(FLAGS_skip_bytes);
      for (std::string& p : paths) {
        if (p.find("{layer}") != std::string::npos) {
          p = absl::StrReplaceAll(p, {{"{layer}", absl::StrCat(l)}});
        }
      }
      if (paths[0] == absl::GetFlag(FLAGS_keys)) offset += l * layer_bytes;  // one file, layer-major
      for (int kv = 0; kv < 2; ++kv) {
        absl::StatusOr<std::string> raw = ReadFile(paths[kv], offset, layer_bytes);
        if (!raw.ok()) return Fail(raw.status());
        TensorToFloat(*raw, dtype, tokens * n, (kv == 0 ? keys : values).data());
      }
    }
    absl::StatusOr<v1::AppendResponse> r;
    if (channel != nullptr) {
      r = PushLayerNccl(channel.get(), seq, l, tokens, chunk, n, dtype, keys.data(), values.data());
    } else {
      std::vector<v1::AppendChunk> chunks;
      for (int t = 0; t < tokens; t += chunk) {
        const int c = std::min(chunk, tokens - t);
        const absl::Span<const uint32_t> chunk_ids =
            ids->empty() ? absl::Span<const uint32_t>() : absl::MakeConstSpan(*ids).subspan(t, c);
        chunks.push_back(MakeChunk(seq, l, t, c, keys.data() + t * n, values.data() + t * n, n, dtype, chunk_ids));
        chunks.back().set_new_incarnation(t == 0 && absl::GetFlag(FLAGS_new_incarnation));
      }
      r = client.Append(chunks);
    }
    if (!r.ok()) return Fail(r.status());
    stored += r->tokens_stored();
    duplicate += r->tokens_duplicate();
    progress.Update(static_cast<int64_t>(l + 1) * tokens);
  }
  progress.Done();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("pushed %s: %d layers x %d tokens (%llu stored, %llu already stored) in %.3f s, %.1f MB/s raw\n",
              seq.c_str(), layers, tokens, static_cast<unsigned long long>(stored),
              static_cast<unsigned long long>(duplicate), s, 2.0 * layers * layer_bytes / s / 1e6);
  return 0;
}

int Attend(Client& client, const v1::InfoResponse& info) {
  const int d = info.head_dim();
  const int q_heads = absl::GetFlag(FLAGS_q_heads) > 0 ? absl::GetFlag(FLAGS_q_heads) : 2 * info.kv_heads();
  std::vector<float> queries;
  int count = 1;
  if (!absl::GetFlag(FLAGS_queries).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_queries), std::ios::binary | std::ios::ate);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open ", absl::GetFlag(FLAGS_queries))));
    const int64_t bytes = in.tellg();
    const int64_t per = static_cast<int64_t>(q_heads) * d * 4;
    if (bytes % per != 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_queries), " has ", bytes,
                                                          " bytes, not a multiple of q_heads x head_dim x 4 = ", per)));
    }
    count = static_cast<int>(bytes / per);
    queries.resize(bytes / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(queries.data()), bytes);
  } else {
    std::mt19937 rng(absl::GetFlag(FLAGS_seed));
    std::normal_distribution<float> g(0.0f, 1.0f);
    queries.resize(static_cast<size_t>(q_heads) * d);
    for (float& x : queries) x = g(rng);
  }
  v1::AttendRequest req;
  for (int i = 0; i < count; ++i) {
    v1::AttendItem* it = req.add_items();
    it->set_sequence_id(absl::GetFlag(FLAGS_sequence));
    it->set_layer(absl::GetFlag(FLAGS_layer));
    it->set_dtype(v1::DTYPE_F32);
    it->set_q_heads(q_heads);
    FloatToTensor(queries.data() + static_cast<size_t>(i) * q_heads * d, static_cast<size_t>(q_heads) * d,
                  v1::DTYPE_F32, it->mutable_query());
  }
  absl::StatusOr<v1::AttendResponse> r = client.Attend(req);
  if (!r.ok()) return Fail(r.status());
  std::vector<float> all;
  for (int i = 0; i < count; ++i) {
    const std::vector<float> o = OutputFloats(r->results(i));
    all.insert(all.end(), o.begin(), o.end());
    double norm = 0;
    for (float x : o) norm += x * x;
    std::printf("query %d: %llu tokens (%llu compressed), |out| %.6g, lse[0] %.6g\n", i,
                static_cast<unsigned long long>(r->results(i).tokens()),
                static_cast<unsigned long long>(r->results(i).compressed_tokens()), std::sqrt(norm),
                r->results(i).lse(0));
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    absl::Status st = WriteFile(absl::GetFlag(FLAGS_out), all.data(), all.size() * 4);
    if (!st.ok()) return Fail(st);
  }
  return 0;
}

int Read(Client& client) {
  absl::StatusOr<Client::Tensors> t = client.ReadFloat(absl::GetFlag(FLAGS_sequence), absl::GetFlag(FLAGS_layer),
                                                       absl::GetFlag(FLAGS_first), absl::GetFlag(FLAGS_count));
  if (!t.ok()) return Fail(t.status());
  std::printf("read %llu tokens (%llu from compressed pages)\n", static_cast<unsigned long long>(t->tokens),
              static_cast<unsigned long long>(t->compressed_tokens));
  if (!absl::GetFlag(FLAGS_out_keys).empty()) {
    absl::Status st = WriteFile(absl::GetFlag(FLAGS_out_keys), t->keys.data(), t->keys.size() * 4);
    if (!st.ok()) return Fail(st);
  }
  if (!absl::GetFlag(FLAGS_out_values).empty()) {
    absl::Status st = WriteFile(absl::GetFlag(FLAGS_out_values), t->values.data(), t->values.size() * 4);
    if (!st.ok()) return Fail(st);
  }
  return 0;
}

int Release(Client& client) {
  absl::StatusOr<v1::ReleaseResponse> r = client.Release(absl::GetFlag(FLAGS_sequence));
  if (!r.ok()) return Fail(r.status());
  std::printf("released %s: %llu tokens, %llu pages\n", absl::GetFlag(FLAGS_sequence).c_str(),
              static_cast<unsigned long long>(r->tokens_freed()), static_cast<unsigned long long>(r->pages_freed()));
  return 0;
}

int Length(Client& client) {
  absl::StatusOr<v1::LengthResponse> r = client.Length(absl::GetFlag(FLAGS_sequence));
  if (!r.ok()) return Fail(r.status());
  for (int l = 0; l < r->layers_size(); ++l) {
    const v1::LayerLength& x = r->layers(l);
    std::printf("layer %d: %llu tokens (%llu compressed, %llu in the bf16 window)\n", l,
                static_cast<unsigned long long>(x.tokens()), static_cast<unsigned long long>(x.compressed_tokens()),
                static_cast<unsigned long long>(x.window_tokens()));
  }
  return 0;
}

int PrintStats(Client& client, const v1::InfoResponse& info) {
  absl::StatusOr<v1::StatsResponse> s = client.Stats();
  if (!s.ok()) return Fail(s.status());
  std::printf("info:  %s", info.DebugString().c_str());
  std::printf("stats: %s", s->DebugString().c_str());
  return 0;
}

}  // namespace
}  // namespace cli
}  // namespace driftkv

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "driftkv [--server HOST:PORT] "
      "push|attend|read|release|length|stats|lookup|fork|pin|unpin|watch|bench|demo|fixture|token-hash [flags]\n"
      "see the top of cli/driftkv_main.cc or docs/api.md");
  // --help lists the flags defined in cli/ (absl's default matches only a
  // file named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::StrContains(file, "cli/"); };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: " << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string cmd = args[1];
  if (cmd == "token-hash") return driftkv::cli::TokenHash(absl::GetFlag(FLAGS_tenant));
  driftkv::Client client(driftkv::cli::OptionsFromFlags());
  absl::StatusOr<driftkv::v1::InfoResponse> info = client.Info();
  if (!info.ok()) {
    std::cerr << "driftkv: cannot reach " << absl::GetFlag(FLAGS_server) << ": " << info.status().message() << "\n";
    return 1;
  }
  using namespace driftkv::cli;
  if (cmd == "push") return Push(client, *info);
  if (cmd == "attend") return Attend(client, *info);
  if (cmd == "read") return Read(client);
  if (cmd == "release") return Release(client);
  if (cmd == "length") return Length(client);
  if (cmd == "stats") return PrintStats(client, *info);
  if (cmd == "lookup") return Lookup(client, *info);
  if (cmd == "fork") return Fork(client, absl::GetFlag(FLAGS_sequence));
  if (cmd == "pin") return Pin(client);
  if (cmd == "unpin") return Unpin(client);
  if (cmd == "watch") return Watch(client);
  if (cmd == "bench") return Bench(client);
  if (cmd == "demo") return Demo(client);
  if (cmd == "fixture") return Fixture(client);
  std::cerr << "driftkv: unknown command " << cmd << "\nusage: " << absl::ProgramUsageMessage() << "\n";
  return 2;
}
