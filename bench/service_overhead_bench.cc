// The service's own cost of one Attend, without a GPU: an in-process
// driftkv server on a "null" backend (registered here, not in production
// code) whose EncodePages writes nothing and whose Attend answers at once
// with constant work (the output's first and last element = the query's,
// lse = the item's token count), batched like CUDA (PrefersBatchedAttend).
// Prefills S sequences x T tokens of one layer (bf16 chunks, through the
// Handler), then times, interleaved, --reps calls of the S-item Attend (8
// KV heads x 128, 32 query heads, --dtype queries), inline and by
// reference to a host region (f32 queries and outputs in shared memory):
//   handler         Handler::Attend, no network;
//   grpc            the library client (client/client.h) over loopback;
//   stream          by reference over the AttendStream;
//   doorbell        by reference through a doorbell (wire/doorbell.h);
// and, to split the gRPC path, the protobuf work alone: serialising and
// parsing the request and the response. Every answer is checked.
//
//   service_overhead_bench [--sequences=64] [--context=8192] [--reps=300]
//                          [--dtype=f32|bf16] [--deadlock_detection]
//                          [--device_like=1]  (NullDeviceBackend)
//                          [--poll=N]  (the polling door, N threads)
//                          [--inline_only=1 [--out_bf16=1]]  (inline only)
//                          [--handler_by_reference_only=1 [--with_step=1] [--reuse=1]]
//                          [--grpc_by_reference_only=1]  (the unary call alone)
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/attend_phases.h"
#include "backends/registry.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "client/attend_stream.h"
#include "client/client.h"
#include "client/doorbell.h"
#include "client/regions.h"
#include "service/attend_request_wire.h"
#include "service/attend_reuse.h"
#include "service/process_env.h"
#include "service/server.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using bench::IntFlag;

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD, kQHeads = 32;

// Stores nothing, answers at once: output = query, lse = tokens attended.
class NullBackend : public Backend {
 public:
  std::string name() const override { return "null"; }
  absl::Status EncodePages(absl::Span<EncodeJob>) override { return absl::OkStatus(); }
  absl::Status DecodeTokens(PageId, int, int, int count, float* keys, float* values) override {
    std::fill(keys, keys + static_cast<size_t>(count) * kN, 0.0f);
    std::fill(values, values + static_cast<size_t>(count) * kN, 0.0f);
    return absl::OkStatus();
  }
  void Attend(absl::Span<AttendJob> jobs) override {
    for (AttendJob& j : jobs) {
      const size_t last = static_cast<size_t>(j.q_heads) * kD - 1;
      j.out[0] = j.query[0];
      j.out[last] = j.query[last];
      const float tokens = static_cast<float>(j.window_first + j.window.tokens);
      std::fill(j.lse, j.lse + j.q_heads, tokens);
      j.status = absl::OkStatus();
    }
  }
  bool PrefersBatchedAttend() const override { return true; }
};
const bool kRegistered = RegisterBackend("null", [](const BackendArgs&) {
  return absl::StatusOr<std::unique_ptr<Backend>>(std::make_unique<NullBackend>());
});

// The same, with the CUDA backend's contract for client memory
// (--device_like=1): queries read at query_dev in their dtype, outputs
// written at out_dev/lse_dev, host memory "pinned" for nothing. Inline
// tensors then take the handler's pinned staging, as on the CUDA backend.
class NullDeviceBackend : public NullBackend {
 public:
  std::string name() const override { return "null_device"; }
  bool AddressesClientMemory() const override { return true; }
  absl::Status ReadClientTensors(absl::Span<ClientRead> reads) override {
    for (ClientRead& r : reads) r.bad = -1;
    return absl::OkStatus();
  }
  void Attend(absl::Span<AttendJob> jobs) override {
    for (AttendJob& j : jobs) {
      const size_t last = static_cast<size_t>(j.q_heads) * kD - 1;
      float q[2];
      if (j.query_dev != nullptr) {
        const size_t eb = DTypeBytes(j.query_dtype);
        const char* src = static_cast<const char*>(j.query_dev);
        TensorToFloat(absl::string_view(src, eb), j.query_dtype, 1, &q[0]);
        TensorToFloat(absl::string_view(src + last * eb, eb), j.query_dtype, 1, &q[1]);
      } else {
        q[0] = j.query[0];
        q[1] = j.query[last];
      }
      const float tokens = static_cast<float>(j.window_first + j.window.tokens);
      if (j.out_dev != nullptr) {
        if (j.out_dtype == v1::DTYPE_BF16) {
          static_cast<uint16_t*>(j.out_dev)[0] = FloatToBf16(q[0]);
          static_cast<uint16_t*>(j.out_dev)[last] = FloatToBf16(q[1]);
        } else {
          static_cast<float*>(j.out_dev)[0] = q[0];
          static_cast<float*>(j.out_dev)[last] = q[1];
        }
        std::fill(j.lse_dev, j.lse_dev + j.q_heads, tokens);
      } else {
        j.out[0] = q[0];
        j.out[last] = q[1];
        std::fill(j.lse, j.lse + j.q_heads, tokens);
      }
      j.status = absl::OkStatus();
    }
  }
};
const bool kRegisteredDevice = RegisterBackend("null_device", [](const BackendArgs&) {
  return absl::StatusOr<std::unique_ptr<Backend>>(std::make_unique<NullDeviceBackend>());
});

using Clock = std::chrono::steady_clock;
double Us(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}
// CPU time of the whole process (client, server and gRPC threads), us: the
// host work of a call, less sensitive than wall time to a busy machine.
double CpuUs() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

struct Quantiles {
  double p50, p99;
};
Quantiles Of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

// Per phase, the calls' times in us: AddPhases after each call (this
// thread's AttendPhaseClock totals), PrintPhases their p50s on one line
// after `label`.
using PhaseTimes = std::vector<std::vector<double>>;
void AddPhases(PhaseTimes* phase_us) {
  phase_us->resize(static_cast<int>(AttendPhase::kCount));
  for (size_t p = 0; p < phase_us->size(); ++p) (*phase_us)[p].push_back(1e-3 * AttendPhaseClock::totals()[p]);
}
void PrintPhases(const char* label, const PhaseTimes& phase_us) {
  std::printf("%s", label);
  for (size_t p = 0; p < phase_us.size(); ++p) {
    std::printf(" %s=%.1f", AttendPhaseName(static_cast<AttendPhase>(p)), Of(phase_us[p]).p50);
  }
  std::printf("\n");
}

int Run(int argc, char** argv) {
  const int sequences = IntFlag(argc, argv, "sequences", 64);
  const int context = IntFlag(argc, argv, "context", 8192);
  const int reps = IntFlag(argc, argv, "reps", 300);
  bool bf16 = false;
  bool deadlock_detection = false;
  for (int i = 1; i < argc; ++i) {
    bf16 = bf16 || std::string(argv[i]) == "--dtype=bf16";
    deadlock_detection = deadlock_detection || std::string(argv[i]) == "--deadlock_detection";
  }
  // Set up as driftkv-server is (Abseil's deadlock detector off), unless
  // asked to measure the detector.
  PrepareServerProcess();
  if (deadlock_detection) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  const v1::DType dtype = bf16 ? v1::DTYPE_BF16 : v1::DTYPE_F32;

  ServiceOptions o;
  // --listen=unix:PATH serves (and the gRPC client connects) over a Unix
  // domain socket instead of TCP loopback.
  o.listen = bench::Flag(argc, argv, "listen", "127.0.0.1:0");
  o.metrics_listen = "";
  o.backend = IntFlag(argc, argv, "device_like", 0) != 0 ? "null_device" : "null";
  o.layers = 1;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.pool_bytes = static_cast<uint64_t>(sequences) * (context / 128 + 1) * 80000 + (64ull << 20);
  o.max_sequences = sequences + 8;
  o.max_batch = std::max(o.max_batch, sequences);
  o.region_socket = absl::StrCat("/tmp/driftkv-overhead-", getpid(), ".sock");
  // --poll=N: the polling door (N threads) with 1 MiB socket reads on both
  // sides, as bench/device/dp_server_poll.textproto serves inline Attend.
  const int poll = IntFlag(argc, argv, "poll", 0);
  if (poll > 0) {
    o.attend_poll_threads = poll;
    o.grpc_read_chunk_bytes = 1 << 20;
  }
  auto server = DriftkvServer::Start(o);
  CHECK_OK(server.status());
  Handler& handler = (*server)->handler();

  // Prefill through the Handler (the null backend stores nothing, so one
  // chunk's content serves every chunk).
  constexpr int kChunk = 1024;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::string kv(static_cast<size_t>(kChunk) * kN * 2, '\0');
  for (size_t i = 0; i < kv.size() / 2; ++i) {
    const uint16_t b = FloatToBf16(g(rng));
    std::memcpy(&kv[2 * i], &b, 2);
  }
  for (int s = 0; s < sequences; ++s) {
    for (int first = 0; first < context; first += kChunk) {
      v1::AppendChunk c;
      c.set_sequence_id(absl::StrCat("seq", s));
      c.set_first_token(first);
      c.set_token_count(std::min(kChunk, context - first));
      c.set_dtype(v1::DTYPE_BF16);
      c.set_keys(kv.substr(0, static_cast<size_t>(c.token_count()) * kN * 2));
      c.set_values(c.keys());
      v1::AppendResponse totals;
      CHECK_OK(handler.Append(c, &totals));
    }
  }

  std::vector<float> query(static_cast<size_t>(sequences) * kQHeads * kD);
  for (float& x : query) x = g(rng);
  if (bf16) {
    for (float& x : query) x = Bf16ToFloat(FloatToBf16(x));
  }
  v1::AttendRequest request;
  for (int s = 0; s < sequences; ++s) {
    v1::AttendItem* it = request.add_items();
    it->set_sequence_id(absl::StrCat("seq", s));
    it->set_dtype(dtype);
    it->set_q_heads(kQHeads);
    FloatToTensor(query.data() + static_cast<size_t>(s) * kQHeads * kD, kQHeads * kD, dtype, it->mutable_query());
  }

  ClientOptions co;
  co.target = absl::StartsWith(o.listen, "unix:") ? o.listen : absl::StrCat("127.0.0.1:", (*server)->port());
  co.http2_window_bytes = IntFlag(argc, argv, "http2_window_bytes", 0);
  if (poll > 0) {
    co.read_chunk_bytes = 1 << 20;
    co.poll_attend = true;
  }
  Client client(co);
  const size_t qe = static_cast<size_t>(kQHeads) * kD;
  auto check = [&](const v1::AttendResponse& r) {
    if (r.results_size() != sequences) CHECK_OK(absl::InternalError("wrong number of results"));
    for (int s = 0; s < sequences; ++s) {
      const v1::AttendResult& res = r.results(s);
      const float* want = query.data() + static_cast<size_t>(s) * qe;
      const float* got = reinterpret_cast<const float*>(res.output().data());
      if (res.output().size() != sizeof(float) * qe || got[0] != want[0] || got[qe - 1] != want[qe - 1] ||
          res.lse_size() != kQHeads || res.lse(0) != static_cast<float>(context) ||
          res.tokens() != static_cast<uint64_t>(context)) {
        CHECK_OK(absl::InternalError(absl::StrCat("wrong answer for item ", s)));
      }
    }
  };
  // By reference: f32 queries, outputs and lse in one host region.
  // After the queries, outputs, lse and the doorbell: each item's decode
  // step (bf16 key and value) for --with_step.
  const uint64_t step_bytes = static_cast<uint64_t>(sequences) * 2 * kN * 2;
  auto region = HostRegion::Create(&client, static_cast<uint64_t>(sequences) * (2 * qe + kQHeads) * 4 +
                                                DoorbellClient::Bytes(1 << 20, 1 << 20) + step_bytes + 64);
  CHECK_OK(region.status());
  float* shared = static_cast<float*>((*region)->data());
  const uint64_t out_at = static_cast<uint64_t>(sequences) * qe * 4, lse_at = 2 * out_at;
  const uint64_t bell_at = (lse_at + static_cast<uint64_t>(sequences) * kQHeads * 4 + 63) / 64 * 64;
  std::memcpy(shared, query.data(), query.size() * 4);
  v1::AttendRequest by_ref;
  for (int s = 0; s < sequences; ++s) {
    v1::AttendItem* it = by_ref.add_items();
    it->set_sequence_id(absl::StrCat("seq", s));
    it->set_dtype(v1::DTYPE_F32);
    it->set_q_heads(kQHeads);
    *it->mutable_query_ref() = (*region)->Ref(static_cast<uint64_t>(s) * qe * 4);
    *it->mutable_output_ref() = (*region)->Ref(out_at + static_cast<uint64_t>(s) * qe * 4);
    *it->mutable_lse_ref() = (*region)->Ref(lse_at + static_cast<uint64_t>(s) * kQHeads * 4);
  }
  auto check_ref = [&](const v1::AttendResponse& r) {
    if (r.results_size() != sequences) CHECK_OK(absl::InternalError("wrong number of results (by reference)"));
    for (int s = 0; s < sequences; ++s) {
      const float* want = query.data() + static_cast<size_t>(s) * qe;
      const float* got = shared + out_at / 4 + static_cast<size_t>(s) * qe;
      const float lse = shared[lse_at / 4 + static_cast<size_t>(s) * kQHeads];
      if (got[0] != want[0] || got[qe - 1] != want[qe - 1] || lse != static_cast<float>(context) ||
          r.results(s).tokens() != static_cast<uint64_t>(context) || !r.results(s).output().empty()) {
        CHECK_OK(absl::InternalError(absl::StrCat("wrong answer by reference for item ", s)));
      }
      // Cleared, so that the next call must write them again.
      shared[out_at / 4 + static_cast<size_t>(s) * qe] = 0.0f;
    }
  };
  auto stream = AttendStream::Open(&client);
  CHECK_OK(stream.status());
  *(*stream)->frame().mutable_request() = by_ref;
  auto bell = DoorbellClient::Open(&client, region->get(), bell_at, 1 << 20, 1 << 20);
  CHECK_OK(bell.status());
  {
    // The first Attend of these sequences, before any warm-up: what a
    // fresh server pays once (with --deadlock_detection, the detector
    // records the 128 locks' edges here).
    v1::AttendResponse first;
    const auto t0 = Clock::now();
    CHECK_OK(handler.Attend(by_ref, &first));
    const double us = Us(Clock::now() - t0);
    check_ref(first);
    std::printf("first Handler::Attend by reference: %.1f us, phases us:", us);
    for (int p = 0; p < static_cast<int>(AttendPhase::kCount); ++p) {
      std::printf(" %s=%.1f", AttendPhaseName(static_cast<AttendPhase>(p)), 1e-3 * AttendPhaseClock::totals()[p]);
    }
    std::printf("\n");
  }
  double warm_us[2] = {0, 0};
  for (int i = 0; i < 20; ++i) {  // warm-up: connection, allocator, caches
    const auto t0 = Clock::now();
    absl::StatusOr<v1::AttendResponse> r = client.Attend(request);
    if (i < 2) warm_us[i] = Us(Clock::now() - t0);
    CHECK_OK(r.status());
    check(*r);
    CHECK_OK((*stream)->Call());
    check_ref((*stream)->response());
  }
  // The channel's first inline Attend pays for HTTP/2 windows that have not
  // grown yet (ClientOptions::http2_window_bytes).
  std::printf("gRPC inline Attend before warm-up: first %.1f us, second %.1f us (client HTTP/2 window %s)\n",
              warm_us[0], warm_us[1],
              co.http2_window_bytes > 0 ? absl::StrCat(co.http2_window_bytes, " bytes").c_str() : "gRPC's");

  std::vector<double> hnd, hnd_cpu, rpc, rpc_cpu, req_ser, req_parse, req_wire, resp_ser, resp_parse;
  std::vector<double> hnd_ref, rpc_ref, stream_ref, bell_ref;
  if (IntFlag(argc, argv, "grpc_by_reference_only", 0) != 0) {
    // Only the unary gRPC call by reference, --reps times (for a profiler).
    for (int i = 0; i < reps; ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<v1::AttendResponse> r = client.Attend(by_ref);
      rpc_ref.push_back(Us(Clock::now() - t0));
      CHECK_OK(r.status());
      check_ref(*r);
    }
    std::sort(rpc_ref.begin(), rpc_ref.end());
    std::printf("gRPC unary by reference: p50 %.1f us, p99 %.1f us over %d calls\n", rpc_ref[rpc_ref.size() / 2],
                rpc_ref[rpc_ref.size() * 99 / 100], reps);
    return 0;
  }
  if (IntFlag(argc, argv, "handler_by_reference_only", 0) != 0) {
    // Only Handler::Attend by reference (for a profiler); --with_step=1
    // adds each item's decode step (bf16 key and value by reference), as
    // a decode worker sends them. Prints the median of each phase
    // (backends/attend_phases.h).
    const bool with_step = IntFlag(argc, argv, "with_step", 0) != 0;
    const uint64_t step_at = (bell_at + DoorbellClient::Bytes(1 << 20, 1 << 20) + 63) / 64 * 64;
    if (with_step) {
      std::memcpy(static_cast<char*>((*region)->data()) + step_at, kv.data(), step_bytes);
      for (int s = 0; s < sequences; ++s) {
        v1::AttendItem* it = by_ref.mutable_items(s);
        *it->mutable_new_key_ref() = (*region)->Ref(step_at + static_cast<uint64_t>(s) * 2 * kN * 2);
        *it->mutable_new_value_ref() = (*region)->Ref(step_at + (static_cast<uint64_t>(s) * 2 + 1) * kN * 2);
        it->set_dtype(v1::DTYPE_BF16);
      }
      // The queries, now bf16 too (a decode worker's dtype), each at its
      // item's offset.
      for (int s = 0; s < sequences; ++s) {
        uint16_t* q = reinterpret_cast<uint16_t*>(static_cast<char*>((*region)->data()) + s * qe * 4);
        for (size_t e = 0; e < qe; ++e) q[e] = FloatToBf16(query[s * qe + e]);
      }
    }
    // --via_doorbell=1: each call is made twice, interleaved, through the
    // doorbell and to the Handler directly (the difference is the
    // doorbell's own cost; phases are the direct calls').
    const bool via_doorbell = IntFlag(argc, argv, "via_doorbell", 0) != 0;
    // --reuse=1: the calls keep what the next can use again, as a
    // doorbell's prepared request does (service/attend_reuse.h; kept only
    // on a backend that reads client memory: --device_like=1).
    AttendReuse reuse;
    AttendReuse* const reusing = IntFlag(argc, argv, "reuse", 0) != 0 ? &reuse : nullptr;
    PhaseTimes phase_us;
    for (int i = 0; i < reps; ++i) {
      v1::AttendResponse ref_response;
      for (int s = 0; with_step && s < sequences; ++s) {
        by_ref.mutable_items(s)->set_new_token_index(context + (via_doorbell ? 2 * i : i));
      }
      if (via_doorbell) {
        const auto t0 = Clock::now();
        absl::StatusOr<v1::AttendResponse> r = (*bell)->Attend(by_ref);
        bell_ref.push_back(Us(Clock::now() - t0));
        CHECK_OK(r.status());
        if (!with_step) check_ref(*r);
        for (int s = 0; with_step && s < sequences; ++s)
          by_ref.mutable_items(s)->set_new_token_index(context + 2 * i + 1);
      }
      const auto t0 = Clock::now();
      CHECK_OK(handler.Attend(by_ref, &ref_response, "", nullptr, reusing));
      hnd_ref.push_back(Us(Clock::now() - t0));
      AddPhases(&phase_us);
      if (!with_step) check_ref(ref_response);
    }
    if (via_doorbell) {
      std::printf("doorbell, by reference%s: p50 %.1f us, p99 %.1f us\n", with_step ? ", decode steps" : "",
                  Of(bell_ref).p50, Of(bell_ref).p99);
    }
    // Mean and max: one call in page_tokens of a decode loop seals a page
    // in every layer it steps (the p50 and p99 miss it).
    double sum = 0.0, most = 0.0;
    for (double v : hnd_ref) {
      sum += v;
      most = std::max(most, v);
    }
    std::printf("Handler::Attend by reference%s: p50 %.1f us, p99 %.1f us, mean %.1f us, max %.1f us\n",
                with_step ? ", decode steps" : "", Of(hnd_ref).p50, Of(hnd_ref).p99, sum / hnd_ref.size(), most);
    PrintPhases("phases, p50 us:", phase_us);
    return 0;
  }
  if (IntFlag(argc, argv, "inline_only", 0) != 0) {
    // Only inline Attends, over gRPC and to the Handler, interleaved (for
    // a profiler of the inline path); --out_bf16=1 asks for bf16 outputs,
    // the decode worker's dtype.
    const bool out_bf16 = IntFlag(argc, argv, "out_bf16", 0) != 0;
    for (int s = 0; s < sequences && out_bf16; ++s) request.mutable_items(s)->set_output_dtype(v1::DTYPE_BF16);
    auto check_inline = [&](const v1::AttendResponse& r) {
      if (!out_bf16) return check(r);
      for (int s = 0; s < sequences; ++s) {
        const float* want = query.data() + static_cast<size_t>(s) * qe;
        const std::string& out = r.results(s).output();
        uint16_t first = 0, last = 0;
        if (out.size() == 2 * qe) {
          std::memcpy(&first, out.data(), 2);
          std::memcpy(&last, out.data() + 2 * (qe - 1), 2);
        }
        if (out.size() != 2 * qe || first != FloatToBf16(want[0]) || last != FloatToBf16(want[qe - 1]) ||
            r.results(s).lse_size() != kQHeads || r.results(s).lse(0) != static_cast<float>(context)) {
          CHECK_OK(absl::InternalError(absl::StrCat("wrong inline bf16 answer for item ", s)));
        }
      }
    };
    // The same request with its queries in this program's memory and the
    // answer's outputs copied into a buffer of its own (client/client.h,
    // Attend with queries and outputs).
    v1::AttendRequest apart = request;
    std::vector<std::string> query_memory(sequences);
    std::vector<absl::string_view> queries(sequences);
    for (int s = 0; s < sequences; ++s) {
      query_memory[s].swap(*apart.mutable_items(s)->mutable_query());
      queries[s] = query_memory[s];
    }
    const size_t out_bytes = (out_bf16 ? 2 : 4) * qe;
    std::string out_memory(out_bytes * sequences, '\0');
    std::vector<absl::Span<char>> outputs(sequences);
    for (int s = 0; s < sequences; ++s) outputs[s] = absl::Span<char>(&out_memory[s * out_bytes], out_bytes);
    auto check_apart = [&](v1::AttendResponse r) {
      for (int s = 0; s < sequences; ++s) {
        if (!r.results(s).output().empty()) CHECK_OK(absl::InternalError("an output both apart and inline"));
        r.mutable_results(s)->set_output(out_memory.substr(s * out_bytes, out_bytes));
      }
      check_inline(r);
    };
    std::vector<double> apart_us, apart_cpu;
    PhaseTimes inline_phase_us;
    for (int i = 0; i < reps; ++i) {
      double c0 = CpuUs();
      auto t0 = Clock::now();
      absl::StatusOr<v1::AttendResponse> r = client.Attend(request);
      rpc.push_back(Us(Clock::now() - t0));
      rpc_cpu.push_back(CpuUs() - c0);
      CHECK_OK(r.status());
      check_inline(*r);
      v1::AttendResponse direct;
      t0 = Clock::now();
      CHECK_OK(handler.Attend(request, &direct));
      hnd.push_back(Us(Clock::now() - t0));
      AddPhases(&inline_phase_us);
      check_inline(direct);
      std::fill(out_memory.begin(), out_memory.end(), '\0');
      c0 = CpuUs();
      t0 = Clock::now();
      r = client.Attend(apart, queries, outputs);
      apart_us.push_back(Us(Clock::now() - t0));
      apart_cpu.push_back(CpuUs() - c0);
      CHECK_OK(r.status());
      check_apart(*r);
    }
    std::printf("inline, %s queries, %s outputs (%zu bytes request, %zu bytes response), %d reps\n",
                DTypeName(dtype).c_str(), out_bf16 ? "bf16" : "f32", request.ByteSizeLong(),
                client.Attend(request)->ByteSizeLong(), reps);
    std::printf(
        "gRPC (library client): p50 %.1f us, p99 %.1f us; CPU time of all threads p50 %.1f us\n"
        "gRPC, tensors in the caller's memory: p50 %.1f us, p99 %.1f us; CPU time of all threads p50 %.1f us\n"
        "Handler::Attend: p50 %.1f us, p99 %.1f us\n",
        Of(rpc).p50, Of(rpc).p99, Of(rpc_cpu).p50, Of(apart_us).p50, Of(apart_us).p99, Of(apart_cpu).p50, Of(hnd).p50,
        Of(hnd).p99);
    PrintPhases("Handler::Attend phases, p50 us:", inline_phase_us);
    return 0;
  }
  v1::AttendResponse last;
  std::string wire;
  for (int i = 0; i < reps; ++i) {
    double c0 = CpuUs();
    auto t0 = Clock::now();
    absl::StatusOr<v1::AttendResponse> r = client.Attend(request);
    rpc.push_back(Us(Clock::now() - t0));
    rpc_cpu.push_back(CpuUs() - c0);
    CHECK_OK(r.status());
    check(*r);

    v1::AttendResponse response;
    c0 = CpuUs();
    t0 = Clock::now();
    CHECK_OK(handler.Attend(request, &response));
    hnd.push_back(Us(Clock::now() - t0));
    hnd_cpu.push_back(CpuUs() - c0);

    {
      v1::AttendResponse ref_response;
      t0 = Clock::now();
      CHECK_OK(handler.Attend(by_ref, &ref_response));
      hnd_ref.push_back(Us(Clock::now() - t0));
      check_ref(ref_response);
      t0 = Clock::now();
      absl::StatusOr<v1::AttendResponse> rr = client.Attend(by_ref);
      rpc_ref.push_back(Us(Clock::now() - t0));
      CHECK_OK(rr.status());
      check_ref(*rr);
      t0 = Clock::now();
      CHECK_OK((*stream)->Call());
      stream_ref.push_back(Us(Clock::now() - t0));
      check_ref((*stream)->response());
      t0 = Clock::now();
      absl::StatusOr<v1::AttendResponse> br = (*bell)->Attend(by_ref);
      bell_ref.push_back(Us(Clock::now() - t0));
      CHECK_OK(br.status());
      check_ref(*br);
    }

    // The protobuf work alone (what each side does once per call).
    t0 = Clock::now();
    request.SerializeToString(&wire);
    req_ser.push_back(Us(Clock::now() - t0));
    v1::AttendRequest parsed;
    t0 = Clock::now();
    parsed.ParseFromString(wire);
    req_parse.push_back(Us(Clock::now() - t0));
    {
      // The server's read (service/attend_request_wire.h), from the same
      // bytes in 64 KiB slices as gRPC hands them over: the queries stay.
      std::vector<grpc::Slice> slices;
      for (size_t at = 0; at < wire.size(); at += 65536) {
        slices.emplace_back(wire.data() + at, std::min<size_t>(65536, wire.size() - at));
      }
      AttendRequestWire read;
      t0 = Clock::now();
      const bool ok = read.Parse(std::move(slices));
      req_wire.push_back(Us(Clock::now() - t0));
      if (!ok || read.message().items_size() != sequences) CHECK_OK(absl::InternalError("request not read"));
    }
    t0 = Clock::now();
    response.SerializeToString(&wire);
    resp_ser.push_back(Us(Clock::now() - t0));
    v1::AttendResponse back;
    t0 = Clock::now();
    back.ParseFromString(wire);
    resp_parse.push_back(Us(Clock::now() - t0));
  }
  std::printf(
      "service_overhead_bench: %d items x %d tokens, %s queries (%zu bytes request, %zu bytes response), "
      "%d reps\n",
      sequences, context, DTypeName(dtype).c_str(), request.ByteSizeLong(),
      handler.Attend(request, &last).ok() ? last.ByteSizeLong() : 0, reps);
  std::printf("| path | p50 us | p99 us |\n|---|---:|---:|\n");
  auto row = [](const char* name, const std::vector<double>& v) {
    const Quantiles q = Of(v);
    std::printf("| %s | %.1f | %.1f |\n", name, q.p50, q.p99);
  };
  row("gRPC (library client), inline", rpc);
  row("gRPC, CPU time of all threads", rpc_cpu);
  row("Handler::Attend, inline", hnd);
  row("Handler::Attend, inline, CPU time", hnd_cpu);
  row("Handler::Attend, by reference (host region)", hnd_ref);
  row("gRPC unary, by reference", rpc_ref);
  row("AttendStream, by reference", stream_ref);
  row("doorbell, by reference", bell_ref);
  row("request serialise", req_ser);
  row("request parse", req_parse);
  row("request read, queries left in gRPC's slices", req_wire);
  row("response serialise", resp_ser);
  row("response parse", resp_parse);
  bell->reset();
  stream->reset();
  region->reset();
  (*server)->Shutdown(absl::ZeroDuration());
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Run(argc, argv);
}
