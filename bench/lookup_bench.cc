// The cost of a Lookup (docs/prefix_cache.md, "Cost"): an in-process
// driftkv server (CPU backend) whose prefix index holds an --tokens-token
// prompt in every one of --layers layers (pages of 128 tokens: 64 pages x
// 32 layers = 2048 entries by default; 1 KV head x 64, since what a Lookup
// costs does not depend on the pages' size), then --reps Lookups of that
// prompt by its token ids, timed:
//   handler   Handler::Lookup, no network (hashing the ids included);
//   fork      Handler::Fork of the whole prefix into a new sequence (all
//             --layers layers' pages shared), released after each;
//   length    Client::Length over loopback, one caller: the floor of a call;
//   grpc      Client::Lookup over loopback, one caller;
//   keys      the same by the prompt's page keys (1 KiB instead of ~24 KiB);
// and --clients callers at once over loopback for --seconds, each with a
// Client of its own: lookups per second, by token ids and by page keys.
// Every answer is checked (all pages held, MISS_NONE). Abseil's mutex
// deadlock detection is off, as in driftkv-server (service/main.cc).
//
//   lookup_bench [--layers=32] [--tokens=8192] [--reps=2000] [--clients=4] [--seconds=3]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "client/client.h"
#include "service/page_key.h"
#include "service/process_env.h"
#include "service/server.h"
#include "wire/half.h"

namespace driftkv {
namespace {

using bench::IntFlag;

constexpr int kPageTokens = 128, kN = 64;

void Quantiles(const char* what, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto q = [&](double f) { return us[static_cast<size_t>(f * (us.size() - 1))]; };
  std::printf("%-8s p50 %7.1f us  p90 %7.1f us  p99 %7.1f us  (%zu calls)\n", what, q(0.5), q(0.9), q(0.99), us.size());
}

void Check(const v1::LookupResponse& r, uint64_t pages) {
  if (r.pages() != pages || r.miss_reason() != v1::MISS_NONE) {
    CHECK_OK(absl::InternalError(absl::StrCat("unexpected answer: ", r.ShortDebugString())));
  }
}

int Main(int argc, char** argv) {
  const int layers = IntFlag(argc, argv, "layers", 32), tokens = IntFlag(argc, argv, "tokens", 8192);
  const int reps = IntFlag(argc, argv, "reps", 2000), clients = IntFlag(argc, argv, "clients", 4);
  const int seconds = IntFlag(argc, argv, "seconds", 3);
  PrepareServerProcess();  // its server runs in this process, set up as driftkv-server's
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.layers = layers;
  o.codec.kv_heads = 1;
  o.codec.head_dim = kN;
  o.codec.mean_window = kPageTokens;
  o.window_tokens = kPageTokens;
  o.pool_bytes = 256ull << 20;
  auto server = DriftkvServer::Start(o);
  CHECK_OK(server.status());
  Handler& handler = (*server)->handler();

  // The prompt: R more tokens than its pages, so that every page is sealed.
  const int total = tokens + kPageTokens;
  std::vector<uint32_t> ids(total);
  // Ids of a 128K vocabulary (Llama 3's is 128,256): 3-byte varints on the wire.
  for (int i = 0; i < total; ++i) ids[i] = static_cast<uint32_t>((i * 7919u) % 128000u);
  std::string kv(static_cast<size_t>(total) * kN * 2, '\0');
  for (size_t i = 0; i < kv.size() / 2; ++i) {
    const uint16_t b = FloatToBf16(static_cast<float>(i % 17) / 17.0f - 0.5f);
    kv[2 * i] = static_cast<char>(b & 0xff);
    kv[2 * i + 1] = static_cast<char>(b >> 8);
  }
  for (int l = 0; l < layers; ++l) {
    v1::AppendChunk c;
    c.set_sequence_id("prompt");
    c.set_layer(l);
    c.set_token_count(total);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(kv);
    c.set_values(kv);
    for (uint32_t id : ids) c.add_token_ids(id);
    v1::AppendResponse totals;
    CHECK_OK(handler.Append(c, &totals));
  }
  ids.resize(tokens);
  const uint64_t pages = static_cast<uint64_t>(tokens / kPageTokens);
  std::printf("index: %lld entries (%llu pages x %d layers)\n",
              static_cast<long long>(handler.prefix_index().entries()), static_cast<unsigned long long>(pages), layers);

  v1::LookupRequest request;
  for (uint32_t id : ids) request.add_token_ids(id);
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    v1::LookupResponse r;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK(handler.Lookup(request, &r));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    Check(r, pages);
  }
  Quantiles("handler", us);
  // Handler::Fork of the whole prefix (every layer's pages shared), each
  // fork released before the next.
  us.clear();
  for (int i = 0; i < reps; ++i) {
    v1::ForkRequest f;
    f.set_sequence_id(absl::StrCat("fork", i));
    *f.mutable_prefix_token_ids() = request.token_ids();
    v1::ForkResponse fr;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK(handler.Fork(f, &fr));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (fr.tokens() != pages * kPageTokens) CHECK_OK(absl::InternalError(absl::StrCat("fork of ", fr.tokens())));
    v1::ReleaseRequest rel;
    rel.set_sequence_id(f.sequence_id());
    v1::ReleaseResponse rr;
    CHECK_OK(handler.Release(rel, &rr));
  }
  Quantiles("fork", us);

  ClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", (*server)->port());
  // The same prompt by its page keys (what a router that hashes sends).
  v1::LookupRequest by_keys;
  {
    std::vector<PageKey> keys;
    ChainPageKeys(ids, kPageTokens, &keys);
    for (const PageKey& k : keys) by_keys.add_page_keys(std::string(k.view()));
  }
  {
    Client client(co);
    for (int i = 0; i < 50; ++i) Check(*client.Lookup(request), pages);  // warm the channel
    // Interleaved, so that the load of a shared machine falls on each
    // alike; the floor: a Length of the same server, the smallest
    // read-only call.
    std::vector<double> floor_us, keys_us;
    us.clear();
    auto timed = [](auto call) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    for (int i = 0; i < reps; ++i) {
      floor_us.push_back(timed([&] { CHECK_OK(client.Length("prompt").status()); }));
      us.push_back(timed([&] {
        absl::StatusOr<v1::LookupResponse> r = client.Lookup(request);
        CHECK_OK(r.status());
        Check(*r, pages);
      }));
      keys_us.push_back(timed([&] {
        absl::StatusOr<v1::LookupResponse> r = client.Lookup(by_keys);
        CHECK_OK(r.status());
        Check(*r, pages);
      }));
    }
    Quantiles("length", floor_us);
    Quantiles("grpc", us);
    Quantiles("keys", keys_us);
  }

  auto throughput = [&](const char* what, const v1::LookupRequest& req) {
    std::atomic<int64_t> done{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&] {
        Client client(co);
        while (!stop.load()) {
          absl::StatusOr<v1::LookupResponse> r = client.Lookup(req);
          CHECK_OK(r.status());
          Check(*r, pages);
          ++done;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // connect and warm up
    const int64_t from = done.load();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    const int64_t n = done.load() - from;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stop = true;
    for (std::thread& t : threads) t.join();
    std::printf("%d clients, %s: %.0f lookups/s over %.1f s\n", clients, what, n / s, s);
  };
  throughput("by token ids", request);
  throughput("by page keys", by_keys);
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
