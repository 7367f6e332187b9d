// NCCL ingest against gRPC Append (docs/nccl.md), as a client on its own
// GPU of a running driftkv-server-cuda (another GPU):
//   nccl_ingest_bench --target HOST:PORT --device 0 --mode equal|throughput
//   nccl_ingest_bench --target ... --mode fault_child   (sends a header, no data; kill it)
//   nccl_ingest_bench --target ... --mode fault_watch --since_ns T --before_pages P
// equal: the same tokens through Append and through a channel; Read
// byte-equal and Attend bit-equal or exit 1. throughput: raw KV GB/s end to
// end (header RPC + transfer + GPU encode) at --sizes MiB per chunk, NCCL
// then gRPC, same data. fault_watch: waits for the server to abort the
// killed client's channel, prints how long after the header that took and
// checks that the pool is unchanged.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/check.h"
#include "client/client.h"
#include "client/nccl_channel.h"
#include "transport/nccl_comm.h"
#include "wire/half.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server");
ABSL_FLAG(int, device, 0, "this client's CUDA device");
ABSL_FLAG(std::string, mode, "equal", "equal, throughput, fault_child, fault_watch or stats");
ABSL_FLAG(std::string, sizes, "8,64,1024", "MiB of raw KV (keys + values) per chunk");
ABSL_FLAG(double, nccl_total_mib, 4096, "raw MiB pushed per size over NCCL (at least one chunk)");
ABSL_FLAG(double, grpc_total_mib, 1024, "raw MiB appended per size over gRPC");
ABSL_FLAG(int, channels, 2, "NCCL channels (threads) pushing concurrently");
ABSL_FLAG(std::string, target_one, "", "multi: a one-GPU server to compare --target (several GPUs) with");
ABSL_FLAG(int, attend_threads, 8, "multi: client threads issuing Attend batches");
ABSL_FLAG(int, attend_iters, 40, "multi: batches per thread");
ABSL_FLAG(int64_t, since_ns, 0, "fault_watch: when the child sent its header (unix ns)");
ABSL_FLAG(int64_t, before_pages, -1, "fault_watch: pages_in_use before the child");

namespace driftkv {
namespace {

#define CUDA_OK(x) CHECK_OK((x) == cudaSuccess ? absl::OkStatus() : absl::InternalError(#x))

struct Shape {
  int n = 0, layers = 0, kv_heads = 0, head_dim = 0;
};

Shape ShapeOf(Client& c) {
  absl::StatusOr<v1::InfoResponse> info = c.Info();
  CHECK_OK(info.status());
  Shape s;
  s.kv_heads = info->kv_heads();
  s.head_dim = info->head_dim();
  s.n = s.kv_heads * s.head_dim;
  s.layers = info->layers();
  std::printf("server: backend %s, %d layers x %d x %d, nccl_version %d; client nccl_version %d\n",
              info->backend().c_str(), s.layers, s.kv_heads, s.head_dim, info->nccl_version(), NcclComm::Version());
  return s;
}

// bf16 tokens [tokens][n], normal(0, 1) (distinct for a seed).
std::vector<uint16_t> RandomBf16(size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<uint16_t> x(elements);
  for (uint16_t& v : x) v = FloatToBf16(g(rng));
  return x;
}

v1::AppendChunk GrpcChunk(const std::string& seq, uint32_t layer, uint64_t first, uint32_t count, int n,
                          const uint16_t* keys, const uint16_t* values) {
  v1::AppendChunk c;
  c.set_sequence_id(seq);
  c.set_layer(layer);
  c.set_first_token(first);
  c.set_new_incarnation(true);  // the benchmark reuses its ids after releasing them
  c.set_token_count(count);
  c.set_dtype(v1::DTYPE_BF16);
  const size_t bytes = static_cast<size_t>(count) * n * 2;
  c.set_keys(reinterpret_cast<const char*>(keys + first * n), bytes);
  c.set_values(reinterpret_cast<const char*>(values + first * n), bytes);
  return c;
}

v1::PushChunkRequest Header(const std::string& seq, uint32_t layer, uint64_t first, uint32_t count, int n) {
  v1::PushChunkRequest h;
  h.set_sequence_id(seq);
  h.set_layer(layer);
  h.set_first_token(first);
  h.set_token_count(count);
  h.set_dtype(v1::DTYPE_BF16);
  h.set_tensor_bytes(static_cast<uint64_t>(count) * n * 2);
  h.set_new_incarnation(true);  // the benchmark reuses its ids after releasing them
  return h;
}

std::string ReadBytes(Client& c, const std::string& seq, uint32_t layer) {
  v1::ReadRequest r;
  r.set_sequence_id(seq);
  r.set_layer(layer);
  r.set_dtype(v1::DTYPE_F32);
  absl::StatusOr<std::vector<v1::ReadChunk>> chunks = c.Read(r);
  CHECK_OK(chunks.status());
  std::string out;
  for (const v1::ReadChunk& ch : *chunks) out += ch.keys() + ch.values();
  return out;
}

int Equal(Client& client, const Shape& s) {
  const int tokens = 5000, n = s.n;
  const std::vector<uint16_t> k = RandomBf16(static_cast<size_t>(tokens) * n, 1);
  const std::vector<uint16_t> v = RandomBf16(static_cast<size_t>(tokens) * n, 2);
  void *kd, *vd;
  CUDA_OK(cudaMalloc(&kd, k.size() * 2));
  CUDA_OK(cudaMalloc(&vd, v.size() * 2));
  CUDA_OK(cudaMemcpy(kd, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(vd, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  absl::StatusOr<std::unique_ptr<NcclChannel>> ch = NcclChannel::Open(&client, absl::GetFlag(FLAGS_device));
  CHECK_OK(ch.status());
  std::printf("channel %llu open, server device %d\n", static_cast<unsigned long long>((*ch)->id()),
              (*ch)->server_device());
  // Uneven chunks, one repeated (idempotent), on two layers.
  const int cuts[] = {0, 1000, 1001, 1500, 3333, 5000};
  int failures = 0;
  for (uint32_t layer = 0; layer < std::min(2, s.layers); ++layer) {
    for (int i = 0; i + 1 < 6; ++i) {
      const uint32_t count = cuts[i + 1] - cuts[i];
      std::vector<v1::AppendChunk> one = {GrpcChunk("eq_grpc", layer, cuts[i], count, n, k.data(), v.data())};
      CHECK_OK(client.Append(one).status());
      const size_t off = static_cast<size_t>(cuts[i]) * n * 2;
      absl::StatusOr<v1::AppendResponse> r = (*ch)->Push(Header("eq_nccl", layer, cuts[i], count, n),
                                                         static_cast<char*>(kd) + off, static_cast<char*>(vd) + off);
      CHECK_OK(r.status());
    }
    absl::StatusOr<v1::AppendResponse> rep =
        (*ch)->Push(Header("eq_nccl", layer, 1000, 500, n), static_cast<char*>(kd) + 1000 * n * 2,
                    static_cast<char*>(vd) + 1000 * n * 2);
    CHECK_OK(rep.status());
    if (rep->tokens_duplicate() != 500 || rep->tokens_stored() != 0) {
      std::printf("FAIL repeat: stored %llu duplicate %llu\n", static_cast<unsigned long long>(rep->tokens_stored()),
                  static_cast<unsigned long long>(rep->tokens_duplicate()));
      ++failures;
    }
    const std::string a = ReadBytes(client, "eq_grpc", layer), b = ReadBytes(client, "eq_nccl", layer);
    const bool read_equal = a == b && a.size() == static_cast<size_t>(tokens) * n * 8;
    // Attend: 4 query heads per KV head, same query for both.
    v1::AttendRequest req;
    for (const char* seq : {"eq_grpc", "eq_nccl"}) {
      v1::AttendItem* it = req.add_items();
      it->set_sequence_id(seq);
      it->set_layer(layer);
      it->set_dtype(v1::DTYPE_F32);
      it->set_q_heads(4 * s.kv_heads);
      std::mt19937 rng(3 + layer);
      std::normal_distribution<float> g(0.0f, 1.0f);
      std::string q;
      for (int i = 0; i < 4 * n; ++i) {
        const float x = g(rng);
        q.append(reinterpret_cast<const char*>(&x), 4);
      }
      it->set_query(q);
    }
    absl::StatusOr<v1::AttendResponse> at = client.Attend(req);
    CHECK_OK(at.status());
    bool attend_equal =
        at->results(0).output() == at->results(1).output() && at->results(0).lse_size() == at->results(1).lse_size();
    for (int i = 0; attend_equal && i < at->results(0).lse_size(); ++i) {
      const float x = at->results(0).lse(i), y = at->results(1).lse(i);
      attend_equal = std::memcmp(&x, &y, 4) == 0;
    }
    std::printf("layer %u: %d tokens, Read %s (%zu bytes), Attend %s (%llu tokens, %llu compressed)\n", layer, tokens,
                read_equal ? "byte-equal" : "DIFFERENT", a.size(), attend_equal ? "bit-equal" : "DIFFERENT",
                static_cast<unsigned long long>(at->results(0).tokens()),
                static_cast<unsigned long long>(at->results(0).compressed_tokens()));
    failures += !read_equal + !attend_equal;
  }
  CHECK_OK((*ch)->Close());
  CHECK_OK(client.Release("eq_grpc").status());
  CHECK_OK(client.Release("eq_nccl").status());
  std::printf("EQUAL %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

int Throughput(Client& client, const Shape& s) {
  const int n = s.n, layers = s.layers, channels = absl::GetFlag(FLAGS_channels);
  const int max_msg_tokens = static_cast<int>((client.options().max_message_bytes - (1 << 20)) / (4 * n));
  std::vector<double> sizes;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    double d = 0;
    if (absl::SimpleAtod(t, &d)) sizes.push_back(d);
  }
  const double max_mib = *std::max_element(sizes.begin(), sizes.end());
  const size_t max_tokens = static_cast<size_t>(max_mib * (1 << 20) / (4.0 * n));
  // One pattern of max_tokens tokens, on the device and the host.
  const std::vector<uint16_t> k = RandomBf16(max_tokens * n, 11), v = RandomBf16(max_tokens * n, 12);
  void *kd, *vd;
  CUDA_OK(cudaMalloc(&kd, k.size() * 2));
  CUDA_OK(cudaMalloc(&vd, v.size() * 2));
  CUDA_OK(cudaMemcpy(kd, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(vd, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  std::vector<std::unique_ptr<NcclChannel>> chs;
  for (int i = 0; i < channels; ++i) {
    absl::StatusOr<std::unique_ptr<NcclChannel>> ch = NcclChannel::Open(&client, absl::GetFlag(FLAGS_device));
    CHECK_OK(ch.status());
    chs.push_back(*std::move(ch));
  }
  for (double mib : sizes) {
    const uint32_t count = static_cast<uint32_t>(mib * (1 << 20) / (4.0 * n));
    const double chunk_bytes = 4.0 * n * count;
    const int nccl_chunks = std::max(1, static_cast<int>(absl::GetFlag(FLAGS_nccl_total_mib) / mib));
    // Chunk i: layer i % layers of sequence "tp", at the layer's next token.
    absl::Time t0 = absl::Now();
    std::vector<std::thread> threads;
    std::vector<absl::Status> errors(channels);
    for (int c = 0; c < channels; ++c) {
      threads.emplace_back([&, c] {
        for (int i = c; i < nccl_chunks; i += channels) {
          const uint32_t layer = i % layers;
          const uint64_t first = static_cast<uint64_t>(i / layers) * count;
          absl::StatusOr<v1::AppendResponse> r = chs[c]->Push(Header("tp_nccl", layer, first, count, n), kd, vd);
          if (!r.ok()) {
            errors[c] = r.status();
            return;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& e : errors) CHECK_OK(e);
    const double nccl_s = absl::ToDoubleSeconds(absl::Now() - t0);
    const double nccl_gbs = nccl_chunks * chunk_bytes / nccl_s / 1e9;
    CHECK_OK(client.Release("tp_nccl").status());
    // gRPC: the same tokens, messages capped by the message limit.
    const uint32_t grpc_count = std::min<uint32_t>(count, max_msg_tokens);
    const int grpc_chunks =
        std::max(1, static_cast<int>(absl::GetFlag(FLAGS_grpc_total_mib) * (1 << 20) / (4.0 * n * grpc_count)));
    std::vector<v1::AppendChunk> chunks;
    for (int i = 0; i < grpc_chunks; ++i) {
      const uint32_t layer = i % layers;
      const uint64_t first = static_cast<uint64_t>(i / layers) * grpc_count;
      v1::AppendChunk ch = GrpcChunk("tp_grpc", layer, 0, grpc_count, n, k.data(), v.data());
      ch.set_first_token(first);
      chunks.push_back(std::move(ch));
    }
    t0 = absl::Now();
    CHECK_OK(client.Append(chunks).status());
    const double grpc_s = absl::ToDoubleSeconds(absl::Now() - t0);
    const double grpc_gbs = grpc_chunks * 4.0 * n * grpc_count / grpc_s / 1e9;
    CHECK_OK(client.Release("tp_grpc").status());
    std::printf(
        "THROUGHPUT chunk %.0f MiB: nccl %.2f GB/s (%d chunks, %d channels, %.3f s), grpc %.3f GB/s "
        "(%d messages of %.1f MiB, %.3f s), ratio %.1fx\n",
        mib, nccl_gbs, nccl_chunks, channels, nccl_s, grpc_gbs, grpc_chunks, 4.0 * n * grpc_count / (1 << 20), grpc_s,
        nccl_gbs / grpc_gbs);
    std::fflush(stdout);
  }
  for (auto& ch : chs) CHECK_OK(ch->Close());
  return 0;
}

// Opens a channel, sends one chunk's header and never its data; the
// driver kills this process.
int FaultChild(Client& client, const Shape& s) {
  absl::StatusOr<std::unique_ptr<NcclChannel>> ch = NcclChannel::Open(&client, absl::GetFlag(FLAGS_device));
  CHECK_OK(ch.status());
  v1::PushChunkRequest h = Header("fault", 0, 0, 16384, s.n);
  h.set_channel_id((*ch)->id());
  std::thread rpc([&] {
    grpc::ClientContext context;
    v1::AppendResponse r;
    client.stub()->PushChunk(&context, h, &r);
  });
  absl::SleepFor(absl::Milliseconds(50));
  std::printf("SENT %lld\n", static_cast<long long>(absl::ToUnixNanos(absl::Now())));
  std::fflush(stdout);
  absl::SleepFor(absl::Hours(1));
  return 0;
}

int FaultWatch(Client& client) {
  const absl::Time since = absl::FromUnixNanos(absl::GetFlag(FLAGS_since_ns));
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  absl::StatusOr<v1::StatsResponse> st;
  for (;;) {
    st = client.Stats();
    CHECK_OK(st.status());
    if (st->nccl_channels_aborted() > 0 && st->nccl_channels_open() == 0) break;
    if (absl::Now() > give_up) {
      std::printf("FAULT FAIL: no abort within 120 s\n");
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double after = absl::ToDoubleSeconds(absl::Now() - since);
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  CHECK_OK(info.status());
  const bool pool_same = static_cast<int64_t>(st->pages_in_use()) == absl::GetFlag(FLAGS_before_pages);
  const bool in_time = after <= info->nccl_chunk_timeout_seconds() + 1.0;
  std::printf(
      "FAULT channel aborted %.2f s after the header (chunk timeout %.1f s), aborted %llu, pages_in_use %llu "
      "(before %lld), sequences %llu: %s\n",
      after, info->nccl_chunk_timeout_seconds(), static_cast<unsigned long long>(st->nccl_channels_aborted()),
      static_cast<unsigned long long>(st->pages_in_use()), static_cast<long long>(absl::GetFlag(FLAGS_before_pages)),
      static_cast<unsigned long long>(st->sequences()), pool_same && in_time ? "PASS" : "FAIL");
  return pool_same && in_time ? 0 : 1;
}

// 64 sequences x 8K tokens (layer 0) into each server over NCCL; one
// Attend batch of all 64 must be bit-equal on both; then items/s of the
// batch from several client threads on each.
int Multi(Client& multi, const Shape& s) {
  ClientOptions o = multi.options();
  o.target = absl::GetFlag(FLAGS_target_one);
  Client one(o);
  const int sequences = 64, tokens = 8192, n = s.n, q_heads = 4 * s.kv_heads;
  const std::vector<uint16_t> k = RandomBf16(static_cast<size_t>(tokens) * n, 21);
  const std::vector<uint16_t> v = RandomBf16(static_cast<size_t>(tokens) * n, 22);
  void *kd, *vd;
  CUDA_OK(cudaMalloc(&kd, k.size() * 2));
  CUDA_OK(cudaMalloc(&vd, v.size() * 2));
  CUDA_OK(cudaMemcpy(kd, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(vd, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  v1::AttendRequest req;
  for (Client* c : {&multi, &one}) {
    absl::StatusOr<std::unique_ptr<NcclChannel>> ch = NcclChannel::Open(c, absl::GetFlag(FLAGS_device));
    CHECK_OK(ch.status());
    for (int i = 0; i < sequences; ++i) {
      // Distinct sequences: each starts at another offset of the pattern.
      const size_t off = static_cast<size_t>(i % 8) * 512 * n * 2;
      const uint32_t count = static_cast<uint32_t>(tokens - (i % 8) * 512);
      CHECK_OK((*ch)
                   ->Push(Header(absl::StrCat("m", i), 0, 0, count, n), static_cast<char*>(kd) + off,
                          static_cast<char*>(vd) + off)
                   .status());
      if (count < static_cast<uint32_t>(tokens)) {
        CHECK_OK((*ch)->Push(Header(absl::StrCat("m", i), 0, count, tokens - count, n), kd, vd).status());
      }
    }
    CHECK_OK((*ch)->Close());
  }
  absl::StatusOr<v1::StatsResponse> st = multi.Stats();
  CHECK_OK(st.status());
  for (const v1::DeviceStats& d : st->devices()) {
    std::printf("device %d: %llu sequences, %llu pages\n", d.device(), static_cast<unsigned long long>(d.sequences()),
                static_cast<unsigned long long>(d.pages_in_use()));
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int i = 0; i < sequences; ++i) {
    v1::AttendItem* it = req.add_items();
    it->set_sequence_id(absl::StrCat("m", i));
    it->set_layer(0);
    it->set_dtype(v1::DTYPE_F32);
    it->set_q_heads(q_heads);
    std::string q;
    for (int j = 0; j < q_heads * s.head_dim; ++j) {
      const float x = g(rng);
      q.append(reinterpret_cast<const char*>(&x), 4);
    }
    it->set_query(q);
  }
  absl::StatusOr<v1::AttendResponse> a = multi.Attend(req), b = one.Attend(req);
  CHECK_OK(a.status());
  CHECK_OK(b.status());
  bool equal = a->results_size() == b->results_size();
  for (int i = 0; equal && i < a->results_size(); ++i) {
    equal = a->results(i).output() == b->results(i).output() && a->results(i).tokens() == tokens &&
            a->results(i).lse_size() == b->results(i).lse_size();
    for (int h = 0; equal && h < a->results(i).lse_size(); ++h) {
      const float x = a->results(i).lse(h), y = b->results(i).lse(h);
      equal = std::memcmp(&x, &y, 4) == 0;
    }
  }
  std::printf("MULTI Attend of %d x %d tokens: two GPUs vs one %s\n", sequences, tokens,
              equal ? "bit-equal" : "DIFFERENT");
  double rate[2];
  for (int w = 0; w < 2; ++w) {
    Client& c = w == 0 ? multi : one;
    const int threads = absl::GetFlag(FLAGS_attend_threads), iters = absl::GetFlag(FLAGS_attend_iters);
    for (int i = 0; i < 3; ++i) CHECK_OK(c.Attend(req).status());  // warm-up
    const absl::Time t0 = absl::Now();
    std::vector<std::thread> ts;
    std::vector<absl::Status> errors(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < iters; ++i) {
          absl::StatusOr<v1::AttendResponse> r = c.Attend(req);
          if (!r.ok()) {
            errors[t] = r.status();
            return;
          }
        }
      });
    }
    for (std::thread& t : ts) t.join();
    for (const absl::Status& e : errors) CHECK_OK(e);
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    rate[w] = static_cast<double>(threads) * iters * sequences / secs;
    std::printf("MULTI %s: %.0f items/s (%d threads x %d batches of %d x %d, %.3f s, %.3f ms per batch)\n",
                w == 0 ? "two GPUs" : "one GPU", rate[w], threads, iters, sequences, tokens, secs,
                1e3 * secs / (threads * iters));
  }
  std::printf("MULTI speedup %.2fx, results %s\n", rate[0] / rate[1], equal ? "bit-equal" : "DIFFERENT");
  for (int i = 0; i < sequences; ++i) {
    CHECK_OK(multi.Release(absl::StrCat("m", i)).status());
    CHECK_OK(one.Release(absl::StrCat("m", i)).status());
  }
  return equal ? 0 : 1;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  driftkv::ClientOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  o.timeout = absl::Seconds(120);
  o.max_message_bytes = 256 << 20;
  driftkv::Client client(o);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "fault_watch") return driftkv::FaultWatch(client);
  if (mode == "stats") {
    absl::StatusOr<driftkv::v1::StatsResponse> st = client.Stats();
    if (!st.ok()) return 1;
    std::printf("PAGES %llu\n", static_cast<unsigned long long>(st->pages_in_use()));
    return 0;
  }
  const driftkv::Shape s = driftkv::ShapeOf(client);
  if (mode == "fault_child" || mode == "equal" || mode == "throughput" || mode == "multi") {
    if (cudaSetDevice(absl::GetFlag(FLAGS_device)) != cudaSuccess) {
      std::fprintf(stderr, "cannot use device %d\n", absl::GetFlag(FLAGS_device));
      return 1;
    }
  }
  if (mode == "fault_child") return driftkv::FaultChild(client, s);
  if (mode == "equal") return driftkv::Equal(client, s);
  if (mode == "throughput") return driftkv::Throughput(client, s);
  if (mode == "multi") return driftkv::Multi(client, s);
  std::fprintf(stderr, "unknown --mode %s\n", mode.c_str());
  return 2;
}
