// The decode-step benchmark through driftkv: a decode worker's view of one
// step of a model whose attention lives in driftkv. One step = --layers
// dependent Attends (layer l+1's query needs layer l's output), each of
// --sequences items (one per sequence of the batch) with the step's new
// key/value (bf16), GQA --q-heads/8 x 128. Run against a driftkv server on
// the same host (driftkv-server-cuda on a GPU node; the CPU backend works
// too), one path per run:
//
//   ipc_stream    queries, new keys/values, outputs and lse in this
//                 process's GPU memory, registered by CUDA IPC; frames over
//                 the persistent AttendStream
//   ipc_doorbell  the same tensors; requests through a doorbell in host
//                 shared memory (wire/doorbell.h)
//   ipc_unary     the same tensors; one unary Attend RPC per layer
//   shm_doorbell  everything in host shared memory (a CPU client: this
//                 process makes no CUDA call); a doorbell
//   shm_stream    host shared memory; the AttendStream
//   ipc_prepared, shm_prepared
//                 as ipc_doorbell and shm_doorbell, each layer's request
//                 prepared once on the doorbell (wire/doorbell.h, PREPARED
//                 REQUESTS): a call sends no request bytes, only its slot
//                 and the steps taken since
//   inline_bf16   bf16 queries and outputs inline in unary Attend RPCs
//   inline_bf16_apart
//                 the same bytes on the wire, the queries sent from this
//                 program's memory and the outputs copied into it (the
//                 client's Attend with queries and outputs)
//
// The worker does no GPU work between calls (its queries are written into
// the regions before timing), so the figures are the data plane's, not
// two CUDA contexts' time slicing. --prefill pushes --context tokens of
// every sequence and layer first (PushChunk by reference from a CUDA IPC
// buffer with ipc_*, Append by reference from host shared memory
// otherwise); later runs against the same server pass --prefill=0.
//
// Prints one JSON line: per-layer round trip p50/p99 (us), step p50 (ms),
// tokens/s (sequences / step), the server's KV bytes resident (Stats).
//
//   decode_step_bench --target=127.0.0.1:50051 --path=ipc_stream
//       [--layers=32] [--sequences=64] [--context=8192] [--steps=20]
//       [--warmup=3] [--prefill=1] [--q_heads=32] [--tag=run1] [--with_step=1]
//       [--read_chunk_bytes=N] [--poll_attend=1]  (the client's side of the
//       polling door for inline Attend: ClientOptions of client/client.h)
//       [--trace_calls=PATH]  (each timed call's start and end, steady
//       clock ns, as CSV: joined with the server's DRIFTKV_ATTEND_TRACE by
//       bench/device/trace_join.py)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "client/attend_stream.h"
#include "client/client.h"
#include "client/doorbell.h"
#include "client/regions.h"
#include "wire/half.h"

namespace driftkv {
namespace {

using bench::Flag;
using bench::IntFlag;

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD;
constexpr int kChunk = 2048;  // prefill tokens per chunk

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

using Clock = std::chrono::steady_clock;
double Us(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}
double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// Where the tensors of (layer, item) lie in the tensor region.
struct Layout {
  int items, q_heads;
  size_t query_bytes() const { return static_cast<size_t>(q_heads) * kD * 2; }
  size_t slot() const { return query_bytes() * 2 + kN * 2 * 2 + 256; }  // query, output, key, value, lse
  size_t base(int layer, int item) const { return (static_cast<size_t>(layer) * items + item) * slot(); }
  size_t query(int l, int i) const { return base(l, i); }
  size_t output(int l, int i) const { return base(l, i) + query_bytes(); }
  size_t key(int l, int i) const { return base(l, i) + 2 * query_bytes(); }
  size_t value(int l, int i) const { return key(l, i) + kN * 2; }
  size_t lse(int l, int i) const { return value(l, i) + kN * 2; }
  size_t bytes(int layers) const { return static_cast<size_t>(layers) * items * slot(); }
};

v1::TensorRef Ref(uint64_t region, size_t offset) {
  v1::TensorRef r;
  r.set_region_id(region);
  r.set_offset(offset);
  return r;
}

int Run(int argc, char** argv) {
  const std::string target = Flag(argc, argv, "target", "127.0.0.1:50051");
  const std::string path = Flag(argc, argv, "path", "ipc_stream");
  const int layers = IntFlag(argc, argv, "layers", 32);
  const int items = IntFlag(argc, argv, "sequences", 64);
  const int context = IntFlag(argc, argv, "context", 8192);
  const int steps = IntFlag(argc, argv, "steps", 20);
  const int warmup = IntFlag(argc, argv, "warmup", 3);
  const int prefill = IntFlag(argc, argv, "prefill", 1);
  const int q_heads = IntFlag(argc, argv, "q_heads", 32);
  const std::string tag = Flag(argc, argv, "tag", "");
  // 0: attend only, no new key/value (the single-layer latency without a
  // decode step).
  const int with_step = IntFlag(argc, argv, "with_step", 1);
  // > 0: each timed call slower than this many microseconds is printed to
  // stderr with its step, layer and time since the first timed call (where
  // a p99 comes from: a few stalls or a slow tail).
  const int slow_us = IntFlag(argc, argv, "slow_us", 0);
  const std::string trace_calls = Flag(argc, argv, "trace_calls", "");
  const bool ipc = absl::StartsWith(path, "ipc_"), shm = absl::StartsWith(path, "shm_");
  const bool apart = path == "inline_bf16_apart";
  const bool inline_path = path == "inline_bf16" || apart;
  if (!ipc && !shm && !inline_path) CHECK_OK(absl::InvalidArgumentError(absl::StrCat("unknown --path ", path)));

  ClientOptions co;
  co.target = target;
  co.max_message_bytes = 256 << 20;
  co.read_chunk_bytes = IntFlag(argc, argv, "read_chunk_bytes", 0);
  co.poll_attend = IntFlag(argc, argv, "poll_attend", 0) != 0;
  Client client(co);
  CHECK_OK(client.Info().status());
  const Layout lay{items, q_heads};
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);

  // The tensor region: CUDA memory by IPC, or host shared memory.
  std::vector<uint8_t> host(lay.bytes(layers));
  for (int l = 0; l < layers; ++l) {
    for (int i = 0; i < items; ++i) {
      auto fill = [&](size_t off, size_t elements, float scale) {
        for (size_t e = 0; e < elements; ++e) {
          const uint16_t b = FloatToBf16(scale * g(rng));
          std::memcpy(&host[off + 2 * e], &b, 2);
        }
      };
      fill(lay.query(l, i), static_cast<size_t>(q_heads) * kD, 1.0f);
      fill(lay.key(l, i), kN, 1.0f);
      fill(lay.value(l, i), kN, 1.0f);
    }
  }
  uint64_t region_id = 0;
  std::unique_ptr<HostRegion> shm_region;
  void* dev = nullptr;
  if (ipc) {
    CheckCuda(cudaMalloc(&dev, host.size()), "cudaMalloc");
    CheckCuda(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), "upload tensors");
    cudaIpcMemHandle_t h;
    CheckCuda(cudaIpcGetMemHandle(&h, dev), "cudaIpcGetMemHandle");
    int device = 0;
    CheckCuda(cudaGetDevice(&device), "cudaGetDevice");
    auto r = RegisterCudaRegion(&client, absl::string_view(reinterpret_cast<const char*>(&h), sizeof(h)), device,
                                host.size(), 0, "decode_step_bench");
    CHECK_OK(r.status());
    region_id = r->region_id();
  } else if (shm) {
    auto r = HostRegion::Create(&client, host.size());
    CHECK_OK(r.status());
    shm_region = *std::move(r);
    std::memcpy(shm_region->data(), host.data(), host.size());
    region_id = shm_region->id();
  }

  // Prefill: PushChunk by reference (ipc) or Append by reference (shm) or
  // inline bf16 chunks, from one chunk of random tokens reused.
  const auto t_prefill = Clock::now();
  if (prefill) {
    const size_t chunk_bytes = static_cast<size_t>(kChunk) * kN * 2;
    std::vector<uint8_t> chunk(2 * chunk_bytes);
    for (size_t e = 0; e < chunk.size() / 2; ++e) {
      const uint16_t b = FloatToBf16(g(rng));
      std::memcpy(&chunk[2 * e], &b, 2);
    }
    uint64_t chunk_region = 0;
    std::unique_ptr<HostRegion> chunk_host;
    void* chunk_dev = nullptr;
    if (ipc) {
      CheckCuda(cudaMalloc(&chunk_dev, chunk.size()), "cudaMalloc chunk");
      CheckCuda(cudaMemcpy(chunk_dev, chunk.data(), chunk.size(), cudaMemcpyHostToDevice), "upload chunk");
      cudaIpcMemHandle_t h;
      CheckCuda(cudaIpcGetMemHandle(&h, chunk_dev), "cudaIpcGetMemHandle chunk");
      int device = 0;
      CheckCuda(cudaGetDevice(&device), "cudaGetDevice");
      auto r = RegisterCudaRegion(&client, absl::string_view(reinterpret_cast<const char*>(&h), sizeof(h)), device,
                                  chunk.size(), 0, "prefill");
      CHECK_OK(r.status());
      chunk_region = r->region_id();
    } else if (shm) {
      auto r = HostRegion::Create(&client, chunk.size());
      CHECK_OK(r.status());
      chunk_host = *std::move(r);
      std::memcpy(chunk_host->data(), chunk.data(), chunk.size());
      chunk_region = chunk_host->id();
    }
    // Concurrent pushers: the server encodes chunks of different layers in
    // parallel.
    const int threads = 8;
    std::vector<std::thread> pool;
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        while (!failed) {
          const int job = next.fetch_add(1);
          if (job >= items * layers) return;
          const int i = job % items, l = job / items;
          for (int first = 0; first < context; first += kChunk) {
            const int count = std::min(kChunk, context - first);
            absl::Status st;
            if (ipc) {
              v1::PushChunkRequest p;
              p.set_sequence_id(absl::StrCat("dstep", i));
              p.set_layer(l);
              p.set_first_token(first);
              p.set_token_count(count);
              p.set_dtype(v1::DTYPE_BF16);
              p.set_tensor_bytes(static_cast<uint64_t>(count) * kN * 2);
              *p.mutable_keys_ref() = Ref(chunk_region, 0);
              *p.mutable_values_ref() = Ref(chunk_region, chunk_bytes);
              grpc::ClientContext ctx;
              v1::AppendResponse resp;
              const grpc::Status gs = client.stub()->PushChunk(&ctx, p, &resp);
              if (!gs.ok()) st = absl::InternalError(gs.error_message());
            } else {
              v1::AppendChunk c;
              c.set_sequence_id(absl::StrCat("dstep", i));
              c.set_layer(l);
              c.set_first_token(first);
              c.set_token_count(count);
              c.set_dtype(v1::DTYPE_BF16);
              if (shm) {
                *c.mutable_keys_ref() = Ref(chunk_region, 0);
                *c.mutable_values_ref() = Ref(chunk_region, chunk_bytes);
              } else {
                c.set_keys(chunk.data(), static_cast<size_t>(count) * kN * 2);
                c.set_values(chunk.data() + chunk_bytes, static_cast<size_t>(count) * kN * 2);
              }
              st = client.Append({c}).status();
            }
            if (!st.ok()) {
              std::fprintf(stderr, "prefill dstep%d layer %d at %d: %s\n", i, l, first,
                           std::string(st.message()).c_str());
              failed = true;
              return;
            }
          }
        }
      });
    }
    for (auto& t : pool) t.join();
    if (failed) return 1;
    if (chunk_dev != nullptr) {
      CHECK_OK(UnregisterRegion(&client, chunk_region));
      cudaFree(chunk_dev);
    }
  }
  const double prefill_s = Us(Clock::now() - t_prefill) / 1e6;

  // The next token index of every sequence (all layers equal).
  auto len = client.Length("dstep0");
  CHECK_OK(len.status());
  uint64_t next_token = len->layers(0).tokens();

  // One request per layer, built once; each step changes new_token_index.
  std::vector<v1::AttendRequest> requests(layers);
  // inline_bf16_apart: each layer's queries and outputs in `host`.
  std::vector<std::vector<absl::string_view>> queries(layers);
  std::vector<std::vector<absl::Span<char>>> outputs(layers);
  const size_t output_bytes = static_cast<size_t>(q_heads) * kD * 2;
  for (int l = 0; l < layers; ++l) {
    for (int i = 0; i < items; ++i) {
      v1::AttendItem* it = requests[l].add_items();
      it->set_sequence_id(absl::StrCat("dstep", i));
      it->set_layer(l);
      it->set_dtype(v1::DTYPE_BF16);
      it->set_q_heads(q_heads);
      it->set_output_dtype(v1::DTYPE_BF16);
      if (apart) {
        queries[l].emplace_back(reinterpret_cast<const char*>(host.data()) + lay.query(l, i), lay.query_bytes());
        outputs[l].emplace_back(reinterpret_cast<char*>(host.data()) + lay.output(l, i), output_bytes);
      }
      if (inline_path) {
        if (!apart) it->set_query(host.data() + lay.query(l, i), lay.query_bytes());
        if (with_step) {
          it->set_new_key(host.data() + lay.key(l, i), kN * 2);
          it->set_new_value(host.data() + lay.value(l, i), kN * 2);
        }
      } else {
        *it->mutable_query_ref() = Ref(region_id, lay.query(l, i));
        if (with_step) {
          *it->mutable_new_key_ref() = Ref(region_id, lay.key(l, i));
          *it->mutable_new_value_ref() = Ref(region_id, lay.value(l, i));
        }
        *it->mutable_output_ref() = Ref(region_id, lay.output(l, i));
        *it->mutable_lse_ref() = Ref(region_id, lay.lse(l, i));
      }
    }
  }
  std::unique_ptr<AttendStream> stream;
  std::unique_ptr<HostRegion> bell_region;
  std::unique_ptr<DoorbellClient> bell;
  if (absl::EndsWith(path, "_stream")) {
    auto s = AttendStream::Open(&client);
    CHECK_OK(s.status());
    stream = *std::move(s);
  }
  const bool prepared = absl::EndsWith(path, "_prepared");
  if (absl::EndsWith(path, "_doorbell") || prepared) {
    auto r = HostRegion::Create(&client, DoorbellClient::Bytes(1 << 20, 1 << 20));
    CHECK_OK(r.status());
    bell_region = *std::move(r);
    auto b = DoorbellClient::Open(&client, bell_region.get(), 0, 1 << 20, 1 << 20);
    CHECK_OK(b.status());
    bell = *std::move(b);
  }
  const uint64_t first_token = next_token;
  for (int l = 0; prepared && l < layers; ++l) {
    v1::AttendRequest& req = requests[l];
    for (int i = 0; with_step && i < items; ++i) req.mutable_items(i)->set_new_token_index(first_token);
    CHECK_OK(bell->Prepare(static_cast<uint32_t>(l), req));
  }
  std::vector<double> layer_us, step_ms;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> call_times;
  Clock::time_point timed_start = Clock::now();
  v1::AttendResponse response;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto step_start = Clock::now();
    for (int l = 0; l < layers; ++l) {
      v1::AttendRequest& req = requests[l];
      for (int i = 0; with_step && i < items; ++i) req.mutable_items(i)->set_new_token_index(next_token);
      const auto t0 = Clock::now();
      absl::Status st;
      if (prepared) {
        st = bell->AttendPrepared(static_cast<uint32_t>(l), next_token - first_token, &response);
      } else if (stream != nullptr) {
        stream->frame().mutable_request()->Swap(&req);
        st = stream->Call();
        stream->frame().mutable_request()->Swap(&req);
      } else if (bell != nullptr) {
        st = bell->Attend(req).status();
      } else if (apart) {
        st = client.Attend(req, queries[l], outputs[l]).status();
      } else {
        st = client.Attend(req).status();
      }
      const auto t1 = Clock::now();
      if (!st.ok()) {
        std::fprintf(stderr, "step %d layer %d: %s\n", s, l, std::string(st.message()).c_str());
        return 1;
      }
      if (s >= warmup) {
        layer_us.push_back(Us(t1 - t0));
        if (!trace_calls.empty()) call_times.emplace_back(t0, t1);
        if (layer_us.size() == 1) timed_start = t0;
        if (slow_us > 0 && layer_us.back() > slow_us) {
          std::fprintf(stderr, "slow call: step %d layer %d %.1f us at %.3f ms\n", s, l, layer_us.back(),
                       Us(t0 - timed_start) / 1e3);
        }
      }
    }
    if (s >= warmup) step_ms.push_back(Us(Clock::now() - step_start) / 1e3);
    ++next_token;
  }
  if (!trace_calls.empty()) {
    std::FILE* f = std::fopen(trace_calls.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", trace_calls.c_str());
      return 1;
    }
    auto ns = [](Clock::time_point t) {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
    };
    std::fprintf(f, "start_ns,end_ns\n");
    for (const auto& c : call_times) std::fprintf(f, "%lld,%lld\n", ns(c.first), ns(c.second));
    std::fclose(f);
  }
  auto stats = client.Stats();
  CHECK_OK(stats.status());
  const double step = Quantile(step_ms, 0.5);
  // The mean and the slowest step: one step in page_tokens seals a page in
  // every layer (the p50 misses it; tokens/s over many steps does not).
  double step_sum = 0.0, step_max = 0.0;
  for (double v : step_ms) {
    step_sum += v;
    step_max = std::max(step_max, v);
  }
  const double step_mean = step_ms.empty() ? 0.0 : step_sum / step_ms.size();
  std::printf(
      "{\"path\": \"%s\", \"tag\": \"%s\", \"layers\": %d, \"sequences\": %d, \"context\": %d, \"q_heads\": %d, "
      "\"layer_p50_us\": %.1f, \"layer_p99_us\": %.1f, \"step_p50_ms\": %.3f, \"step_mean_ms\": %.3f, "
      "\"step_max_ms\": %.3f, \"tokens_per_s\": %.1f, \"tokens_per_s_mean\": %.1f, "
      "\"kv_bytes_resident\": %llu, \"cold_copy_bytes\": %llu, \"prefill_s\": %.2f, \"with_step\": %d}\n",
      path.c_str(), tag.c_str(), layers, items, context, q_heads, Quantile(layer_us, 0.5), Quantile(layer_us, 0.99),
      step, step_mean, step_max, items / (step / 1e3), step_mean > 0 ? items / (step_mean / 1e3) : 0.0,
      // The hot tier's cold copies are a cache the pool takes back on
      // demand, not KV held for the sequences: reported apart.
      static_cast<unsigned long long>(stats->bytes_in_use() - stats->cold_copy_bytes() + stats->hot_bytes_in_use() +
                                      stats->window_bytes()),
      static_cast<unsigned long long>(stats->cold_copy_bytes()), prefill_s, with_step);
  if (dev != nullptr) {
    UnregisterRegion(&client, region_id).IgnoreError();
    cudaFree(dev);
  }
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Run(argc, argv);
}
