// The CUDA backend's Attend launch: everything one launch of the attention
// kernels reads from the host goes up in one staging upload (or stays on
// the device from an earlier launch of the same jobs: launch_plans.h),
// queries in client memory are gathered, the kernels run, and answers go to
// client memory (the merge writes them) or back to the host. It owns the
// state only launches use: the device window cache and its upload ring,
// the launch buffers, the kept plans, the client tensor lists and the
// stage timer. The backend calls it under its lock, on its device.
#ifndef DRIFTKV_BACKENDS_CUDA_ATTEND_LAUNCHER_H_
#define DRIFTKV_BACKENDS_CUDA_ATTEND_LAUNCHER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/cuda/client_io.h"
#include "backends/cuda/cold_levels.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/launch_plans.h"
#include "backends/cuda/stage_timer.h"
#include "backends/cuda/window_cache.h"
#include "backends/cuda/window_upload.h"
#include "backends/page_pool.h"
#include "codec/level_page.h"
#include "codec/page_layout.h"
#include "kernels/level_promote.h"

namespace driftkv {
namespace cuda_backend {

// The inputs of one attention launch, packed into one pinned staging
// buffer and uploaded with one copy (pinned and reused: no page faults,
// full-speed DMA). Byte offsets, each region 256-byte aligned:
//   [0, table)            5 x [items] int32: page_start, tokens,
//                         window_tokens, layer, window_start
//   [table, client)       the page table, int32
//   [client, window_keys) client tensors' lists (ClientIo)
//   [window_keys, window_values), [window_values, query)
//                         bf16 window tokens: a few missing tokens of
//                         cached windows (each upload's keys then values,
//                         from window_keys on), or every window back to
//                         back (keys, then values)
//   [query, bytes)        the queries, [items][q_heads][head_dim] float;
//                         not uploaded when every query is in client memory
// Cached windows' missing tokens up to this size ride in a launch's
// staging upload (a 256-item decode step's one token a window, at 8 KV
// heads x 128); more go through the window ring.
inline constexpr size_t kStagedWindowBytes = size_t{1} << 20;

struct StagingLayout {
  StagingLayout(int items, size_t table_entries, size_t client_bytes, size_t query_floats, size_t window_tokens,
                int n) {
    auto align = [](size_t b) { return (b + 255) & ~static_cast<size_t>(255); };
    table = align(static_cast<size_t>(items) * 5 * 4);
    client = table + align(std::max<size_t>(table_entries, 1) * 4);
    window_keys = client + align(client_bytes);
    window_values = window_keys + align(window_tokens * n * 2);
    query = window_values + align(window_tokens * n * 2);
    bytes = query + align(query_floats * 4);
  }
  size_t table, client, query, window_keys, window_values, bytes;
};

// What a launch reads of its backend: set once the backend's device
// memory exists, stable afterwards.
struct AttendDevice {
  cudaStream_t stream = nullptr;
  PageLayout layout;  // the cold pages' (head_dim, n)
  int page_tokens = 0;
  PageId base = 0;  // page id of the arena's first page
  const void* arena = nullptr;
  const uint32_t* tables_dev = nullptr;  // the cold kernel's decode tables
  const void* hot_arena = nullptr;       // null: no hot tier
  PageId hot_base = 0;                   // hot page id of the hot arena's first page
  LevelPageLayout hot_layout;
  const float* transforms_dev = nullptr;  // null: the codec's Hadamard
  int transform_layers = 0;
  bool values_folded = false;
  gpu::PromoteParams cold_promotion;  // of cold launches' pages (ColdLevels)
};

// The decode batch the launch buffers (and the backend's promotion ids)
// are sized for at start: 64 items of 32 query heads over 8K tokens.
constexpr int kWarmItems = 64, kWarmQHeads = 32, kWarmTokens = 8192;

class AttendLauncher {
 public:
  AttendLauncher();

  // The window cache (`window_cache_bytes` of device memory, 0: none), the
  // cold launches' level page scratch (`cold_scratch_bytes`, 0: none) and
  // the launch buffers sized for the warm batch (kWarmItems ...):
  // allocated by the first call that needs them
  // (pinned memory above all, and cudaFree waits for the device), they
  // cost that call tens of milliseconds. Larger batches still grow them.
  absl::Status Init(const AttendDevice& device, size_t window_cache_bytes, size_t cold_scratch_bytes);

  // One launch of jobs with equal (q_heads, softmax_scale, tier). On a
  // failure the window cache and the kept plans are forgotten.
  absl::Status Run(absl::Span<AttendJob> jobs);
  // Backend::CacheWindows.
  absl::Status CacheWindows(absl::Span<const AttendJob> jobs);
  // Backend::ReadClientTensors.
  absl::Status ReadClientTensors(absl::Span<ClientRead> reads) { return client_io_.Read(reads, dev_.stream); }

 private:
  // Where a launch's inputs lie on the device.
  struct LaunchInputs {
    const uint8_t* plan = nullptr;  // StagingLayout's [0, window_keys): items' arrays, page table, client lists
    const StagingLayout* layout = nullptr;
    const ClientLaunch* client = nullptr;
    const uint8_t* window_keys = nullptr;
    const uint8_t* window_values = nullptr;
    float* query = nullptr;  // the query rows
    int max_pages = 0;
  };
  // A launch plan kept on the device (launch_plans.h): the bytes of a
  // launch's StagingLayout up to its windows, and what the launch needs
  // besides them.
  struct KeptPlan {
    Scratch dev;
    StagingLayout layout{0, 0, 0, 0, 0, 1};
    ClientLaunch client;
    std::vector<int> slot_of;
    int max_pages = 0;
  };
  // AttendPlanned's arrays, kept for their capacity.
  struct LaunchPlan {
    std::vector<int32_t> table, start, tokens, wtok, layers, wstart;
    std::vector<int> slot_of;
    std::vector<WindowCache::Upload> uploads;
  };

  absl::Status CheckLayer(int layer) const;
  static void StageHostQueries(absl::Span<AttendJob> jobs, size_t row_floats, uint8_t* rows);
  absl::Status ReserveOutputs(int items, int q_heads, int max_pages, size_t stage_bytes);
  absl::Status AttendKept(absl::Span<AttendJob> jobs, const KeptPlan& kept);
  absl::Status AttendPlanned(absl::Span<AttendJob> jobs);
  absl::Status RunAttention(absl::Span<AttendJob> jobs, const LaunchInputs& in);

  AttendDevice dev_;
  WindowCache windows_;           // bf16 windows kept on the device
  WindowUploader window_upload_;  // their missing tokens' way in
  ClientIo client_io_;
  ColdLevels cold_levels_;
  std::vector<int> item_pages_;  // a cold launch's, for cold_levels_
  LaunchPlan plan_;
  ClientLaunch client_launch_;  // AttendPlanned's
  // Launch plans kept on the device, entry e's in kept_[e].
  LaunchPlans plans_;
  std::vector<KeptPlan> kept_;
  Scratch a_stage_, a_out_, a_ws_;
  ZeroedScratch merge_counters_;  // the level kernel's, items x kv_heads words
  PinnedScratch host_stage_, host_out_;
  StageTimer timer_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_ATTEND_LAUNCHER_H_
