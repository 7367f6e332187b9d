// Attend on the CUDA backend with the tensors in another process's device
// memory (a CUDA IPC region) and in a host region: every answer is byte for
// byte what the same item answers inline on the same server (queries f32
// and bf16, outputs f32 and bf16, GQA groups 2 and 4, a decode step), over
// sets of sequences of identical content ("i-" inline, "d-" device, "h-"
// host), on a server without a hot tier and on one whose layers go hot
// (the level kernel). A process cannot open its own IPC handles, so a child forked
// before any CUDA call of this process owns the allocation and copies
// bytes in and out of it on the parent's commands. Prints "skipped: no
// GPU" without one.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/regions.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "service/attend_reuse.h"
#include "service/handler.h"
#include "service/server.h"
#include "tests/data_plane_items.h"
#include "tests/loopback_server.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::ItemSpec;
using testing::kD;
using testing::kSmallN;

constexpr uint64_t kDeviceBytes = 1 << 20;
constexpr int kPrefill = 300;  // two 128-token pages (the CUDA kernels take 128) and a window

bool ReadFull(int fd, void* p, size_t n) {
  for (char* c = static_cast<char*>(p); n > 0;) {
    const ssize_t got = read(fd, c, n);
    if (got <= 0) return false;
    c += got;
    n -= got;
  }
  return true;
}

bool WriteFull(int fd, const void* p, size_t n) {
  for (const char* c = static_cast<const char*>(p); n > 0;) {
    const ssize_t put = write(fd, c, n);
    if (put <= 0) return false;
    c += put;
    n -= put;
  }
  return true;
}

// The parent's commands to the child: 'w' then `bytes` bytes, copied to
// the allocation at `offset` and answered by 'k' (or 'e'); 'r', answered
// by `bytes` bytes from `offset`; 'q' ends the child.
struct Command {
  uint64_t op, offset, bytes;
};

// The child: the 64 bytes of a cudaIpcMemHandle_t of kDeviceBytes (zeros
// without a GPU) to `out`, then commands from `in`.
[[noreturn]] void Child(int out, int in) {
  char handle[64] = {};
  char* dev = nullptr;
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
      cudaMalloc(reinterpret_cast<void**>(&dev), kDeviceBytes) == cudaSuccess) {
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, dev) == cudaSuccess) std::memcpy(handle, &h, sizeof(handle));
  }
  WriteFull(out, handle, sizeof(handle));
  Command c;
  std::string buf;
  while (ReadFull(in, &c, sizeof(c)) && c.op != 'q') {
    buf.resize(c.bytes);
    if (c.op == 'w') {
      const bool ok = ReadFull(in, buf.data(), c.bytes) &&
                      cudaMemcpy(dev + c.offset, buf.data(), c.bytes, cudaMemcpyHostToDevice) == cudaSuccess;
      WriteFull(out, ok ? "k" : "e", 1);
    } else {
      if (cudaMemcpy(buf.data(), dev + c.offset, c.bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        buf.assign(c.bytes, '\0');
      }
      WriteFull(out, buf.data(), c.bytes);
    }
  }
  _exit(0);
}

// The child's allocation, registered as region `id`.
class DeviceArena : public testing::Arena {
 public:
  DeviceArena(uint64_t id, int to_child, int from_child)
      : Arena(id, kDeviceBytes), to_child_(to_child), from_child_(from_child) {}
  std::string Bytes(const v1::TensorRef& ref, size_t bytes) const override {
    const Command c{'r', ref.offset(), bytes};
    std::string out(bytes, '\0');
    EXPECT_TRUE(WriteFull(to_child_, &c, sizeof(c)) && ReadFull(from_child_, out.data(), bytes));
    return out;
  }

 private:
  void Write(uint64_t offset, const std::string& bytes) override {
    const Command c{'w', offset, bytes.size()};
    char reply = 0;
    EXPECT_TRUE(WriteFull(to_child_, &c, sizeof(c)) && WriteFull(to_child_, bytes.data(), bytes.size()) &&
                ReadFull(from_child_, &reply, 1));
    EXPECT_EQ(reply, 'k') << "the child could not copy to its allocation";
  }
  const int to_child_, from_child_;
};

// The child process; the destructor ends it.
struct ChildProcess {
  ~ChildProcess() {
    if (pid <= 0) return;
    const Command q{'q', 0, 0};
    WriteFull(to_child[1], &q, sizeof(q));
    int status = 0;
    waitpid(pid, &status, 0);
  }
  pid_t pid = -1;
  int to_parent[2] = {-1, -1}, to_child[2] = {-1, -1};
};

// Queries f32 and bf16 x outputs f32 and bf16 on layer 1 (no step), and a
// decode step of token kPrefill + round on layer 0.
std::vector<ItemSpec> Specs(int round) {
  std::vector<ItemSpec> v;
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    for (v1::DType out : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
      ItemSpec s;
      s.seq = "s0";
      s.layer = 1;
      s.q_heads = v.size() % 2 == 0 ? 4 : 8;
      s.dtype = dtype;
      s.out_dtype = out;
      s.query = testing::Gaussian(s.q_heads * kD, 100 * round + v.size());
      v.push_back(s);
    }
  }
  ItemSpec step;
  step.seq = "s0";
  step.layer = 0;
  step.q_heads = 4;
  step.query = testing::Gaussian(4 * kD, 100 * round + 50);
  step.key = testing::Gaussian(kSmallN, 100 * round + 51);
  step.value = testing::Gaussian(kSmallN, 100 * round + 52);
  step.token_index = kPrefill + round;
  v.push_back(step);
  return v;
}

// The whole check on one server of its own, its pages in the cold tier or
// (hot) in the hot tier, where the level kernel attends: the answers must
// be the inline ones. `handle` is the child's allocation.
void CheckReferencesAnswerInline(bool hot, const char* handle, const ChildProcess& child) {
  SCOPED_TRACE(hot ? "hot tier" : "cold tier");
  ServiceOptions o = testing::SmallOptions(32u << 20);
  o.backend = "cuda";
  o.codec.mean_window = 128;  // the CUDA kernels' page
  if (hot) o.hot_tier_bytes = 64 * MakeLevelPageLayout(kSmallN / kD, kD)->page_bytes;
  o.region_socket = absl::StrCat("/tmp/driftkv-data-plane-gpu-test-",
                                 absl::Hex(uint64_t{std::random_device()()} << 32 | std::random_device()()), ".sock");
  std::unique_ptr<DriftkvServer> server;  // destroyed before the child ends
  std::unique_ptr<Client> client;
  absl::Status st = testing::StartLoopback(o, {}, {}, &server, &client);
  ASSERT_TRUE(st.ok()) << st;
  std::vector<v1::AppendChunk> chunks;
  for (const char* prefix : {"i-", "d-", "h-"}) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      const testing::Kv kv = testing::SyntheticKv(kPrefill, kSmallN, 60 + layer);
      chunks.push_back(testing::ChunkOf(std::string(prefix) + "s0", layer, 0, kPrefill, kv));
    }
  }
  ASSERT_TRUE(client->Append(chunks).ok());

  absl::StatusOr<v1::RegisterRegionResponse> reg =
      RegisterCudaRegion(client.get(), absl::string_view(handle, 64), 0, kDeviceBytes);
  ASSERT_TRUE(reg.ok()) << reg.status();
  DeviceArena device(reg->region_id(), child.to_child[1], child.to_parent[0]);
  absl::StatusOr<std::unique_ptr<HostRegion>> host_region = HostRegion::Create(client.get(), 1 << 18);
  ASSERT_TRUE(host_region.ok()) << host_region.status();
  testing::HostArena host(host_region->get());

  // The inline answers to `specs` (on the "i-" sequences), and a check
  // that `got`, by reference into `arena`, gives the same bits.
  auto inline_answers = [&](const std::vector<ItemSpec>& specs) {
    v1::AttendRequest inline_req;
    for (const ItemSpec& s : specs) *inline_req.add_items() = testing::Inline(s, "i-");
    return client->Attend(inline_req);
  };
  auto expect_inline = [](const v1::AttendResponse& want, const std::vector<ItemSpec>& specs,
                          const v1::AttendRequest& req, const v1::AttendResponse& got, const testing::Arena& arena,
                          const std::string& what) {
    for (size_t i = 0; i < specs.size(); ++i) {
      testing::ExpectSame(testing::InlineAnswer(want.results(i)),
                          testing::RefAnswer(specs[i], req.items(i), got.results(i), arena),
                          absl::StrCat(what, " item ", i));
    }
  };
  for (int round = 0; round < 2; ++round) {
    const std::vector<ItemSpec> specs = Specs(round);
    absl::StatusOr<v1::AttendResponse> want = inline_answers(specs);
    ASSERT_TRUE(want.ok()) << want.status();
    for (testing::Arena* arena : std::vector<testing::Arena*>{&device, &host}) {
      const std::string prefix = arena == &device ? "d-" : "h-";
      arena->Reset();
      v1::AttendRequest req;
      for (const ItemSpec& s : specs) *req.add_items() = testing::ByRef(s, prefix, *arena);
      absl::StatusOr<v1::AttendResponse> got = client->Attend(req);
      ASSERT_TRUE(got.ok()) << prefix << ": " << got.status();
      expect_inline(*want, specs, req, *got, *arena, absl::StrCat(prefix, " round ", round));
    }
  }
  // A request that keeps its items and sequences between calls (a
  // prepared doorbell request's AttendReuse) answers the inline bits call
  // after call, its outputs cleared before each.
  {
    std::vector<ItemSpec> specs = Specs(5);
    specs.pop_back();  // no decode step: kept
    absl::StatusOr<v1::AttendResponse> want = inline_answers(specs);
    ASSERT_TRUE(want.ok()) << want.status();
    for (testing::Arena* arena : std::vector<testing::Arena*>{&device, &host}) {
      const std::string prefix = arena == &device ? "d-" : "h-";
      AttendReuse reuse;
      for (int call = 0; call < 3; ++call) {
        arena->Reset();  // the same offsets: the queries again, the outputs cleared
        v1::AttendRequest req;
        for (const ItemSpec& s : specs) *req.add_items() = testing::ByRef(s, prefix, *arena);
        v1::AttendResponse got;
        absl::Status st = server->handler().Attend(req, &got, "", nullptr, &reuse);
        ASSERT_TRUE(st.ok()) << prefix << ": " << st;
        EXPECT_FALSE(reuse.empty()) << prefix << ": the request was not kept";
        expect_inline(*want, specs, req, got, *arena, absl::StrCat(prefix, " kept, call ", call));
      }
    }
  }
  // A non-finite query by reference is refused naming the item and the
  // element, and changes nothing: without a decode step the attention
  // launch checks it, with one (applied before attention) it is checked
  // first (queries in host regions by the CPU, which can name the value).
  // The same for an element above kQueryLimit (-2^100): the device's
  // check cannot tell the two apart, the host's names the value.
  for (testing::Arena* arena : std::vector<testing::Arena*>{&device, &host}) {
    const std::string prefix = arena == &device ? "d-" : "h-";
    for (bool with_step : {false, true}) {
      for (bool finite : {false, true}) {
        std::vector<ItemSpec> specs = Specs(2);
        ItemSpec bad = specs[0];  // layer 1, no step
        bad.query[37] = finite ? -0x1p100f : std::numeric_limits<float>::quiet_NaN();
        std::vector<ItemSpec> batch = {with_step ? specs.back() : specs[1], bad};
        arena->Reset();
        v1::AttendRequest req;
        for (const ItemSpec& spec : batch) *req.add_items() = testing::ByRef(spec, prefix, *arena);
        absl::StatusOr<v1::AttendResponse> got = client->Attend(req);
        const std::string what =
            absl::StrCat(prefix, with_step ? " with a step" : " without a step", finite ? ", -2^100" : ", nan");
        EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << what << ": " << got.status();
        const std::string want = arena == &device ? "items[1].query_ref element 37 is not finite or |x| > 7.92282e+28"
                                 : finite ? "items[1].query_ref element 37 is -1.26765e+30; |x| must be <= 7.92282e+28"
                                          : "items[1].query_ref element 37 is nan; must be finite";
        EXPECT_NE(got.status().message().find(want), std::string::npos) << what << ": " << got.status();
        absl::StatusOr<v1::LengthResponse> len = client->Length(prefix + "s0");
        ASSERT_TRUE(len.ok()) << len.status();
        EXPECT_EQ(len->layers(0).tokens(), static_cast<uint64_t>(kPrefill + 2)) << what << ": the step was stored";
      }
    }
  }
  EXPECT_TRUE(UnregisterRegion(client.get(), reg->region_id()).ok());
  host_region->reset();
  client.reset();
  if (hot) {
    // Every layer attended went hot (the level kernel answered).
    v1::StatsResponse stats;
    server->handler().Stats(&stats);
    EXPECT_GT(stats.hot_pages_in_use(), 0u);
  }
  server->Shutdown(absl::Seconds(1));
}

// One test for both tiers: the child must be forked before this process
// makes any CUDA call, so there is one child for the process.
TEST(DataPlaneGpuTest, CudaIpcAndHostReferencesAnswerInlineBitForBitInBothTiers) {
  ChildProcess child;
  ASSERT_EQ(pipe(child.to_parent), 0);
  ASSERT_EQ(pipe(child.to_child), 0);
  child.pid = fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) Child(child.to_parent[1], child.to_child[0]);
  char handle[64];
  ASSERT_TRUE(ReadFull(child.to_parent[0], handle, sizeof(handle)));
  SKIP_WITHOUT_GPU();
  if (std::string(handle, 64) == std::string(64, '\0')) GTEST_SKIP() << "the child could not allocate";
  for (bool hot : {false, true}) {
    CheckReferencesAnswerInline(hot, handle, child);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace driftkv
