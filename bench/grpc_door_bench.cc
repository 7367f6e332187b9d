// The bare gRPC door on this host, no driftkv in it: one process, a
// server and a client over loopback TCP, 3,000 calls (p50/p90/p99 of the
// last 2,800). What a round trip costs before any work, and what polling
// and larger socket reads change (docs/data_plane.md, "A polling door for
// inline Attend").
//
//   grpc_door_bench SPIN_SERVER SPIN_CLIENT    (each 0 or 1)
//     Length with an empty answer; with PAYLOAD=1 in the environment,
//     Attend carrying 64 x 8 KiB each way (0.5 MiB, the size of 64 bf16
//     queries of 32 x 128), answered with its own bytes.
//     SPIN_SERVER=1: an async server whose thread polls its queue with a
//     zero timeout; 0: gRPC's synchronous server. SPIN_CLIENT=1: the call
//     waits by polling its own queue; 0: the blocking stub.
//   environment: CHUNK=1 1 MiB socket reads on both sides
//     (grpc.experimental.tcp_read_chunk_size and tcp_min_read_chunk_size);
//     WIN=1 8 MiB HTTP/2 lookahead and 16 MiB frames; ZEROCQ=1 the
//     synchronous server's pollers with a zero timeout; RAW=1 instead of
//     gRPC a plain TCP ping-pong of the same 0.5 MiB each way (the
//     kernel's floor); HEALTH=1 with the health and reflection
//     services, ICPT=N with N interceptors that do nothing; with PAYLOAD,
//     STRIPES=N: the same 64 items as N calls of 64/N at once, each on a
//     connection and a client thread of its own (blocking stubs), timed
//     from the first call's start to the last answer.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>
#include "proto/driftkv.grpc.pb.h"
struct NopI : grpc::experimental::Interceptor {
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override { m->Proceed(); }
};
struct NopF : grpc::experimental::ServerInterceptorFactoryInterface {
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo*) override {
    return new NopI;
  }
};
using namespace driftkv;
static int kItems = 64, kBytes = 8192;  // 64 x 8 KiB = 0.5 MiB each way
static void FillResp(const v1::AttendRequest& q, v1::AttendResponse* r) {
  for (const auto& it : q.items()) r->add_results()->set_output(it.query());
}
struct SyncSvc : v1::KvCache::Service {
  grpc::Status Attend(grpc::ServerContext*, const v1::AttendRequest* q, v1::AttendResponse* r) override {
    FillResp(*q, r);
    return grpc::Status::OK;
  }
  grpc::Status Length(grpc::ServerContext*, const v1::LengthRequest*, v1::LengthResponse* r) override {
    r->add_layers();
    return grpc::Status::OK;
  }
};
struct Call {
  grpc::ServerContext ctx;
  v1::LengthRequest req;
  grpc::ServerAsyncResponseWriter<v1::LengthResponse> w{&ctx};
  bool done = false;
  bool attend = false;
  v1::AttendRequest areq;
  grpc::ServerAsyncResponseWriter<v1::AttendResponse> aw{&ctx};
};
static double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[size_t(p * (v.size() - 1))];
}
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
static void RwAll(int fd, char* p, size_t n, bool w) {
  size_t d = 0;
  while (d < n) {
    ssize_t k = w ? write(fd, p + d, n - d) : read(fd, p + d, n - d);
    if (k <= 0) {
      perror("rw");
      exit(1);
    }
    d += k;
  }
}
static int RawTcp() {
  const size_t n = size_t(kItems) * kBytes;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, (sockaddr*)&a, sizeof a);
  listen(ls, 1);
  socklen_t al = sizeof a;
  getsockname(ls, (sockaddr*)&a, &al);
  std::thread srv([&] {
    int c = accept(ls, nullptr, nullptr);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<char> b(n);
    while (true) {
      RwAll(c, b.data(), n, false);
      RwAll(c, b.data(), n, true);
      if (b[0] == 'q') break;
    }
    close(c);
  });
  int c = socket(AF_INET, SOCK_STREAM, 0);
  connect(c, (sockaddr*)&a, sizeof a);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> b(n, 'x');
  std::vector<double> us;
  for (int i = 0; i < 3000; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    RwAll(c, b.data(), n, true);
    RwAll(c, b.data(), n, false);
    if (i >= 200)
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  b[0] = 'q';
  RwAll(c, b.data(), n, true);
  RwAll(c, b.data(), n, false);
  srv.join();
  close(c);
  close(ls);
  printf("raw tcp 0.5MiB each way p50 %.1f us p90 %.1f p99 %.1f\n", Pct(us, .5), Pct(us, .9), Pct(us, .99));
  return 0;
}

// PAYLOAD with STRIPES=N: N threads, each with its own channel (a distinct
// channel argument keeps gRPC from sharing one connection), each sending
// 64/N items per round; the main thread releases a round and waits for all.
static int Striped(int port, const grpc::ChannelArguments& base, int stripes, int n) {
  struct Worker {
    std::unique_ptr<v1::KvCache::Stub> stub;
    v1::AttendRequest req;
    std::thread t;
    bool ok = true;
    std::string error;  // the first failed call's status
  };
  std::vector<Worker> w(stripes);
  std::atomic<int> round{-1}, done{0};
  std::atomic<bool> quit{false};
  const bool block = getenv("BLOCK") != nullptr;  // workers sleep between rounds
  std::mutex mu;
  std::condition_variable cv;
  for (int s = 0; s < stripes; ++s) {
    grpc::ChannelArguments a = base;
    a.SetInt("driftkv.stripe", s);
    w[s].stub = v1::KvCache::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), a));
    for (int k = s; k < kItems; k += stripes) w[s].req.add_items()->set_query(std::string(kBytes, char('a' + k % 26)));
  }
  for (int s = 0; s < stripes; ++s) {
    w[s].t = std::thread([&, s] {
      for (int seen = -1;;) {
        int r;
        if (block) {
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return round.load() != seen || quit.load(); });
        }
        while ((r = round.load(std::memory_order_acquire)) == seen && !quit.load()) {
        }
        if (quit.load()) return;
        seen = r;
        grpc::ClientContext ctx;
        v1::AttendResponse resp;
        grpc::Status st = w[s].stub->Attend(&ctx, w[s].req, &resp);
        if (w[s].ok && (!st.ok() || resp.results_size() != w[s].req.items_size())) {
          w[s].ok = false;
          w[s].error = st.ok() ? "wrong number of results" : st.error_message();
        }
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    done.store(0);
    auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> l(mu);
      round.store(i, std::memory_order_release);
    }
    if (block) cv.notify_all();
    while (done.load(std::memory_order_acquire) != stripes) {
    }
    if (i >= 200)
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  {
    std::lock_guard<std::mutex> l(mu);
    quit.store(true);
  }
  cv.notify_all();
  bool ok = true;
  for (auto& x : w) {
    x.t.join();
    if (!x.ok) fprintf(stderr, "bad striped call: %s\n", x.error.c_str());
    ok = ok && x.ok;
  }
  if (!ok) return 1;
  printf("attend 0.5MiB each way in %d stripes%s%s p50 %.1f us p90 %.1f p99 %.1f\n", stripes,
         getenv("CHUNK") ? " chunk" : "", block ? " blocking workers" : "", Pct(us, .5), Pct(us, .9), Pct(us, .99));
  return 0;
}
int main(int argc, char** argv) {
  if (getenv("RAW")) return RawTcp();
  bool spin_server = argc > 1 && argv[1][0] == '1';
  bool spin_client = argc > 2 && argv[2][0] == '1';
  int n = 3000;
  v1::KvCache::AsyncService asvc;
  SyncSvc ssvc;
  if (getenv("HEALTH")) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }
  grpc::ServerBuilder b;
  int port = 0;
  b.SetMaxReceiveMessageSize(64 << 20);
  b.SetMaxSendMessageSize(64 << 20);
  grpc::ChannelArguments cargs;
  cargs.SetMaxReceiveMessageSize(64 << 20);
  cargs.SetMaxSendMessageSize(64 << 20);
  if (getenv("WIN")) {
    for (auto* kv : {"grpc.http2.lookahead_bytes"}) {
      b.AddChannelArgument(kv, 8 << 20);
      cargs.SetInt(kv, 8 << 20);
    }
    b.AddChannelArgument("grpc.http2.max_frame_size", (16 << 20) - 1);
    cargs.SetInt("grpc.http2.max_frame_size", (16 << 20) - 1);
  }
  if (getenv("ZEROCQ")) b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 0);
  if (getenv("CHUNK")) {
    for (auto* kv : {"grpc.experimental.tcp_read_chunk_size", "grpc.experimental.tcp_min_read_chunk_size"}) {
      b.AddChannelArgument(kv, 1 << 20);
      cargs.SetInt(kv, 1 << 20);
    }
  }
  if (getenv("ICPT")) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
    for (int k = 0; k < atoi(getenv("ICPT")); ++k) v.push_back(std::make_unique<NopF>());
    b.experimental().SetInterceptorCreators(std::move(v));
  }
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  if (spin_server) {
    b.RegisterService(&asvc);
    cq = b.AddCompletionQueue();
  } else
    b.RegisterService(&ssvc);
  auto server = b.BuildAndStart();
  std::atomic<bool> stop{false};
  std::thread t;
  if (spin_server) {
    t = std::thread([&] {
      auto* c = new Call;
      asvc.RequestLength(&c->ctx, &c->req, &c->w, cq.get(), cq.get(), c);
      auto* a = new Call;
      a->attend = true;
      asvc.RequestAttend(&a->ctx, &a->areq, &a->aw, cq.get(), cq.get(), a);
      void* tag;
      bool ok;
      while (true) {
        auto r = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
        if (r == grpc::CompletionQueue::SHUTDOWN) break;
        if (r != grpc::CompletionQueue::GOT_EVENT) continue;
        auto* k = static_cast<Call*>(tag);
        if (!ok || k->done) {
          delete k;
          continue;
        }
        k->done = true;
        if (k->attend) {
          auto* nc = new Call;
          nc->attend = true;
          asvc.RequestAttend(&nc->ctx, &nc->areq, &nc->aw, cq.get(), cq.get(), nc);
          v1::AttendResponse resp;
          FillResp(k->areq, &resp);
          k->aw.Finish(resp, grpc::Status::OK, k);
        } else {
          auto* nc = new Call;
          asvc.RequestLength(&nc->ctx, &nc->req, &nc->w, cq.get(), cq.get(), nc);
          v1::LengthResponse resp;
          resp.add_layers();
          k->w.Finish(resp, grpc::Status::OK, k);
        }
      }
    });
  }
  if (getenv("PAYLOAD") && getenv("STRIPES") && !spin_server) {
    const int rc = Striped(port, cargs, atoi(getenv("STRIPES")), n);
    server->Shutdown();
    return rc;
  }
  auto ch = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), cargs);
  auto stub = v1::KvCache::NewStub(ch);
  grpc::CompletionQueue ccq;
  std::vector<double> us;
  const bool payload = getenv("PAYLOAD") != nullptr;
  v1::AttendRequest areq;
  for (int k = 0; k < kItems; ++k) areq.add_items()->set_query(std::string(kBytes, char('a' + k % 26)));
  for (int i = 0; i < n; ++i) {
    v1::LengthRequest req;
    req.set_sequence_id("s");
    v1::LengthResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st;
    if (getenv("DL")) ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto t0 = std::chrono::steady_clock::now();
    v1::AttendResponse aresp;
    if (payload) {
      if (!spin_client)
        st = stub->Attend(&ctx, areq, &aresp);
      else {
        auto rpc = stub->AsyncAttend(&ctx, areq, &ccq);
        rpc->Finish(&aresp, &st, (void*)1);
        void* tag;
        bool ok;
        while (ccq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) != grpc::CompletionQueue::GOT_EVENT) {
        }
      }
      if (aresp.results_size() == kItems) resp.add_layers();
    } else if (!spin_client)
      st = stub->Length(&ctx, req, &resp);
    else {
      auto rpc = stub->AsyncLength(&ctx, req, &ccq);
      rpc->Finish(&resp, &st, (void*)1);
      void* tag;
      bool ok;
      while (ccq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) != grpc::CompletionQueue::GOT_EVENT) {
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    if (!st.ok() || resp.layers_size() != 1) {
      fprintf(stderr, "bad %s\n", st.error_message().c_str());
      return 1;
    }
    if (i >= 200) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  printf("%s%s spin_server=%d spin_client=%d p50 %.1f us p90 %.1f p99 %.1f\n",
         payload ? (getenv("WIN") ? (getenv("CHUNK") ? "attend win+chunk" : "attend win")
                                  : (getenv("CHUNK") ? "attend chunk" : "attend 0.5MiB each way"))
                 : "length",
         getenv("ZEROCQ") ? " zerocq" : "", spin_server, spin_client, Pct(us, .5), Pct(us, .9), Pct(us, .99));
  server->Shutdown();
  if (spin_server) {
    cq->Shutdown();
    t.join();
  }
  return 0;
}
