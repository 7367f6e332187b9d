#include "backends/cuda/attend_launcher.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "backends/attend_phases.h"
#include "kernels/attention.h"
#include "kernels/level_attention.h"
#include "wire/tensor.h"

namespace driftkv {
namespace cuda_backend {
namespace {

// Launch plans kept on the device (launch_plans.h): 128, or
// DRIFTKV_KEPT_PLANS (0: none, every launch uploads its plan; a probe for
// side-by-side measurements, not a setting to serve with).
int KeptPlanCapacity() {
  const char* v = std::getenv("DRIFTKV_KEPT_PLANS");
  if (v == nullptr || *v == '\0') return 128;
  return std::max(0, std::min(4096, std::atoi(v)));
}

// The largest plan kept (its arrays, page table and client lists): 128
// plans take at most 64 MiB of device memory. A 64-item launch over 8K
// tokens needs ~22 KB; one whose table alone is larger (256 items over
// 128K tokens) is long enough that its upload does not matter.
constexpr size_t kMaxKeptPlanBytes = size_t{512} << 10;
// Threads (the caller counted) packing a round of window uploads, eight
// 512 KiB windows a 4 MiB round at 8 KV heads x 128 (WindowUploader says
// why), without taking many of the host's cores from the service's own
// threads.
constexpr int kWindowPackThreads = 4;

}  // namespace

AttendLauncher::AttendLauncher() : plans_(KeptPlanCapacity()), kept_(static_cast<size_t>(plans_.capacity())) {}

absl::Status AttendLauncher::Init(const AttendDevice& device, size_t window_cache_bytes, size_t cold_scratch_bytes) {
  dev_ = device;
  absl::Status st = windows_.Init(window_cache_bytes, dev_.layout.n());
  if (st.ok()) st = cold_levels_.Init(dev_.cold_promotion, cold_scratch_bytes);
  if (st.ok() && windows_.enabled()) st = window_upload_.Init(dev_.layout.n(), kWindowPackThreads);
  if (!st.ok()) return st;
  const int d = dev_.layout.head_dim, pages = kWarmTokens / dev_.page_tokens;
  const size_t qsz = static_cast<size_t>(kWarmItems) * kWarmQHeads * d;
  absl::StatusOr<size_t> client_bytes = client_io_.Warm(kWarmItems);
  if (!client_bytes.ok()) return client_bytes.status();
  const StagingLayout stage(kWarmItems, static_cast<size_t>(kWarmItems) * pages, *client_bytes, qsz, 0,
                            dev_.layout.n());
  return ReserveOutputs(kWarmItems, kWarmQHeads, pages, stage.bytes);
}

absl::Status AttendLauncher::CheckLayer(int layer) const {
  if (dev_.transforms_dev == nullptr || (layer >= 0 && layer < dev_.transform_layers)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", layer, " has no transform (the set has ", dev_.transform_layers, " layers)"));
}

absl::Status AttendLauncher::CacheWindows(absl::Span<const AttendJob> jobs) {
  std::vector<WindowCache::Upload>& uploads = plan_.uploads;
  if (!windows_.Plan(jobs, &plan_.slot_of, &uploads) || uploads.empty()) return absl::OkStatus();
  absl::Status st = window_upload_.Upload(jobs, uploads, windows_, dev_.stream);
  if (st.ok()) st = Cuda(cudaStreamSynchronize(dev_.stream), "cache windows");
  if (!st.ok()) windows_.Invalidate();
  return st;
}

absl::Status AttendLauncher::Run(absl::Span<AttendJob> jobs) {
  const int kept = plans_.Find(jobs);
  absl::Status st =
      kept >= 0 && windows_.Keep(jobs, kept_[kept].slot_of) ? AttendKept(jobs, kept_[kept]) : AttendPlanned(jobs);
  // A failure may come after window slots were planned and before their
  // tokens arrived, or after a plan was recorded and before it reached
  // the device: forget both rather than trust them.
  if (!st.ok()) {
    windows_.Invalidate();
    plans_.Clear();
  }
  return st;
}

// Host queries into the staging's query rows, each checked as it is
// staged when asked (the gather checks those it reads in client memory).
void AttendLauncher::StageHostQueries(absl::Span<AttendJob> jobs, size_t row_floats, uint8_t* rows) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].query_dev != nullptr) continue;
    std::memcpy(rows + i * row_floats * 4, jobs[i].query, sizeof(float) * row_floats);
    if (jobs[i].check_query) jobs[i].query_bad = FirstOutOfRange(jobs[i].query, v1::DTYPE_F32, row_floats, kQueryLimit);
  }
}

// The output buffers and workspace of a launch of these jobs.
absl::Status AttendLauncher::ReserveOutputs(int items, int q_heads, int max_pages, size_t stage_bytes) {
  const size_t qsz = static_cast<size_t>(items) * q_heads * dev_.layout.head_dim;
  const size_t out_bytes = (qsz + static_cast<size_t>(items) * q_heads) * 4;
  absl::Status st = a_stage_.Reserve(stage_bytes);
  if (st.ok()) st = host_stage_.Reserve(stage_bytes);
  if (st.ok()) st = a_out_.Reserve(out_bytes);
  if (st.ok()) st = host_out_.Reserve(out_bytes);
  if (st.ok())
    st = a_ws_.Reserve(gpu::AttentionWorkspaceBytes(items, q_heads, dev_.layout.head_dim, std::max(max_pages, 1)));
  if (st.ok()) st = merge_counters_.Reserve(sizeof(uint32_t) * items * dev_.layout.kv_heads);
  return st;
}

// A launch whose plan the device already holds: only host queries go
// up, and the window slots it names were checked by WindowCache::Keep.
absl::Status AttendLauncher::AttendKept(absl::Span<AttendJob> jobs, const KeptPlan& kept) {
  const StagingLayout& stage = kept.layout;
  const int items = static_cast<int>(jobs.size()), q_heads = jobs[0].q_heads;
  absl::Status st = ReserveOutputs(items, q_heads, kept.max_pages, stage.bytes);
  if (!st.ok()) return st;
  uint8_t* h = host_stage_.get<uint8_t>();
  uint8_t* dstage = a_stage_.get<uint8_t>();
  const bool host_queries = !ClientIo::AllQueries(jobs);
  if (host_queries) StageHostQueries(jobs, static_cast<size_t>(q_heads) * dev_.layout.head_dim, h + stage.query);
  AttendPhaseClock::Mark(AttendPhase::kBackendPlan);
  timer_.Mark(StageTimer::kStart, dev_.stream);
  if (host_queries) {
    st = Cuda(cudaMemcpyAsync(dstage + stage.query, h + stage.query, stage.bytes - stage.query, cudaMemcpyHostToDevice,
                              dev_.stream),
              "upload queries");
  }
  timer_.Mark(StageTimer::kUploaded, dev_.stream);
  LaunchInputs in;
  in.plan = kept.dev.get<uint8_t>();
  in.layout = &stage;
  in.client = &kept.client;
  in.window_keys = windows_.keys_dev();
  in.window_values = windows_.values_dev();
  in.query = reinterpret_cast<float*>(dstage + stage.query);
  in.max_pages = kept.max_pages;
  if (st.ok()) st = client_io_.GatherQueries(*in.client, in.plan + stage.client, in.query, dev_.stream);
  if (!st.ok()) return st;
  return RunAttention(jobs, in);
}

// A launch planned from its jobs. When its windows are all on the device
// already, its plan is recorded and uploaded into a kept plan's memory
// (the queries, when on the host, into the staging), so that the next
// launch of the same jobs finds it (AttendKept).
absl::Status AttendLauncher::AttendPlanned(absl::Span<AttendJob> jobs) {
  const int items = static_cast<int>(jobs.size()), q_heads = jobs[0].q_heads, d = dev_.layout.head_dim,
            n = dev_.layout.n();
  const int P = dev_.page_tokens;
  // Per-call arrays, kept in members for their capacity.
  std::vector<int32_t>& table = plan_.table;
  std::vector<int32_t>& start = plan_.start;
  std::vector<int32_t>& tokens = plan_.tokens;
  std::vector<int32_t>& wtok = plan_.wtok;
  std::vector<int32_t>& layers = plan_.layers;
  table.clear();
  start.resize(items);
  tokens.resize(items);
  wtok.resize(items);
  layers.resize(items);
  size_t entries = 0;
  for (const AttendJob& j : jobs) entries += j.pages.size();
  table.reserve(entries);
  int max_pages = 0;
  for (int i = 0; i < items; ++i) {
    const AttendJob& j = jobs[i];
    absl::Status lst = CheckLayer(j.layer);
    if (!lst.ok()) return lst;
    layers[i] = j.layer;
    if (j.window.tokens > gpu::kMaxWindow) {
      return absl::InvalidArgumentError(
          absl::StrCat("bf16 window of ", j.window.tokens, " tokens exceeds ", gpu::kMaxWindow));
    }
    start[i] = static_cast<int32_t>(table.size());
    const size_t at = table.size();
    table.resize(at + j.pages.size());
    // Hot jobs' pages index the hot arena, cold jobs' the page arena.
    const PageId base = j.hot ? dev_.hot_base : dev_.base;
    for (size_t k = 0; k < j.pages.size(); ++k) table[at + k] = static_cast<int32_t>(j.pages[k] - base);
    tokens[i] = static_cast<int32_t>(j.pages.size()) * P;
    wtok[i] = static_cast<int32_t>(j.window.tokens);
    max_pages = std::max(max_pages, static_cast<int>(j.pages.size()));
  }
  // Everything the launch reads from the host goes through one staging
  // buffer (StagingLayout). Windows: device slots (only missing tokens are
  // uploaded), or, when the launch cannot be cached, all of them staged
  // back to back.
  std::vector<int32_t>& wstart = plan_.wstart;
  std::vector<int>& slot_of = plan_.slot_of;
  std::vector<WindowCache::Upload>& uploads = plan_.uploads;
  wstart.resize(items);
  slot_of.clear();
  uploads.clear();
  const bool cached = windows_.Plan(jobs, &slot_of, &uploads);
  size_t total_w = 0;
  // Cached windows' missing tokens: a few ride in the staging upload,
  // many go through window_upload_'s ring.
  bool staged_uploads = false;
  if (cached) {
    for (int i = 0; i < items; ++i) wstart[i] = slot_of[i] < 0 ? 0 : slot_of[i] * gpu::kMaxWindow;
    staged_uploads = !uploads.empty() && window_upload_.Bytes(uploads) <= kStagedWindowBytes;
    if (staged_uploads) {
      for (const WindowCache::Upload& u : uploads) total_w += static_cast<size_t>(u.count);
    }
  } else {
    for (int i = 0; i < items; ++i) {
      wstart[i] = static_cast<int32_t>(total_w);
      total_w += static_cast<size_t>(wtok[i]);
    }
  }
  const size_t qsz = static_cast<size_t>(items) * q_heads * d;
  // Client tensors' item lists travel in the same upload.
  absl::Status st = client_io_.Plan(jobs, q_heads * d, &client_launch_);
  if (!st.ok()) return st;
  const StagingLayout stage(items, table.size(), client_launch_.bytes(), qsz, total_w, n);
  const size_t off_table = stage.table, off_client = stage.client, off_query = stage.query, off_wk = stage.window_keys;
  const size_t off_wv = stage.window_values, stage_bytes = stage.bytes;
  st = ReserveOutputs(items, q_heads, max_pages, stage_bytes);
  if (!st.ok()) return st;
  uint8_t* h = host_stage_.get<uint8_t>();
  int32_t* hs = reinterpret_cast<int32_t*>(h);
  std::memcpy(hs, start.data(), items * 4);
  std::memcpy(hs + items, tokens.data(), items * 4);
  std::memcpy(hs + 2 * items, wtok.data(), items * 4);
  std::memcpy(hs + 3 * items, layers.data(), items * 4);
  std::memcpy(hs + 4 * items, wstart.data(), items * 4);
  std::memcpy(h + off_table, table.data(), table.size() * 4);
  ClientIo::Stage(client_launch_, h + off_client);
  StageHostQueries(jobs, static_cast<size_t>(q_heads) * d, h + off_query);
  for (int i = 0; !cached && i < items; ++i) {
    const size_t wn = static_cast<size_t>(wtok[i]) * n;
    if (wn == 0) continue;
    std::memcpy(h + off_wk + static_cast<size_t>(wstart[i]) * n * 2, jobs[i].window.keys, wn * 2);
    std::memcpy(h + off_wv + static_cast<size_t>(wstart[i]) * n * 2, jobs[i].window.values, wn * 2);
  }
  if (staged_uploads) window_upload_.Pack(jobs, uploads, h + off_wk);
  uint8_t* dstage = a_stage_.get<uint8_t>();
  const bool host_queries = !ClientIo::AllQueries(jobs);
  // A plan worth keeping: every window already in its slot.
  KeptPlan* kept = nullptr;
  if (cached && uploads.empty() && off_wk <= kMaxKeptPlanBytes) {
    const int e = plans_.Record(jobs);
    if (e >= 0) {
      kept = &kept_[e];
      st = kept->dev.Reserve(off_wk);
      if (!st.ok()) return st;  // Run forgets every plan
      kept->layout = stage;
      kept->client = client_launch_;
      kept->slot_of = slot_of;
      kept->max_pages = max_pages;
    }
  }
  const uint8_t* plan_dev = kept != nullptr ? kept->dev.get<uint8_t>() : dstage;
  AttendPhaseClock::Mark(AttendPhase::kBackendPlan);
  timer_.Mark(StageTimer::kStart, dev_.stream);
  if (kept != nullptr) {
    st = Cuda(cudaMemcpyAsync(kept->dev.get<void>(), h, off_wk, cudaMemcpyHostToDevice, dev_.stream), "upload plan");
    if (st.ok() && host_queries) {
      st = Cuda(cudaMemcpyAsync(dstage + off_query, h + off_query, stage_bytes - off_query, cudaMemcpyHostToDevice,
                                dev_.stream),
                "upload queries");
    }
  } else {
    // Every query in client memory: the query rows are gathered below.
    const size_t used = host_queries ? stage_bytes : off_query;
    st = Cuda(cudaMemcpyAsync(dstage, h, used, cudaMemcpyHostToDevice, dev_.stream), "upload attention inputs");
  }
  timer_.Mark(StageTimer::kUploaded, dev_.stream);
  LaunchInputs in;
  in.plan = plan_dev;
  in.layout = &stage;
  in.client = &client_launch_;
  in.window_keys = cached ? windows_.keys_dev() : dstage + off_wk;
  in.window_values = cached ? windows_.values_dev() : dstage + off_wv;
  in.query = reinterpret_cast<float*>(dstage + off_query);
  in.max_pages = max_pages;
  if (st.ok()) st = client_io_.GatherQueries(client_launch_, plan_dev + off_client, in.query, dev_.stream);
  if (!st.ok()) return st;
  // A failure here leaves slots without their tokens: AttendRun forgets
  // the cache.
  if (staged_uploads) {
    st = window_upload_.Scatter(uploads, windows_, dstage + off_wk, dev_.stream);
  } else if (cached && !uploads.empty()) {
    st = window_upload_.Upload(jobs, uploads, windows_, dev_.stream);
  }
  if (!st.ok()) return st;
  return RunAttention(jobs, in);
}

// The attention kernels of a launch whose inputs are queued (`in`), its
// outputs to the client or back to the host, and the wait for them.
absl::Status AttendLauncher::RunAttention(absl::Span<AttendJob> jobs, const LaunchInputs& in) {
  const int items = static_cast<int>(jobs.size()), q_heads = jobs[0].q_heads, d = dev_.layout.head_dim;
  const size_t qsz = static_cast<size_t>(items) * q_heads * d;
  const size_t out_bytes = (qsz + static_cast<size_t>(items) * q_heads) * 4;
  timer_.Mark(StageTimer::kInputsDone, dev_.stream);
  const int32_t* small = reinterpret_cast<const int32_t*>(in.plan);
  const bool hot = jobs[0].hot;
  if (hot && dev_.hot_arena == nullptr) return absl::FailedPreconditionError("hot job without a hot tier");
  // One batch for whichever kernel the pages need.
  gpu::AttentionBatch batch;
  batch.items = items;
  batch.q_heads = q_heads;
  batch.max_pages = in.max_pages;
  batch.page_table_dev = reinterpret_cast<const int32_t*>(in.plan + in.layout->table);
  batch.page_start_dev = small;
  batch.tokens_dev = small + items;
  batch.window_tokens_dev = small + 2 * items;
  batch.window_start_dev = small + 4 * items;
  batch.window_k_dev = reinterpret_cast<const uint16_t*>(in.window_keys);
  batch.window_v_dev = reinterpret_cast<const uint16_t*>(in.window_values);
  batch.query_dev = in.query;
  batch.softmax_scale = jobs[0].softmax_scale;
  batch.out_dev = a_out_.get<float>();
  batch.lse_dev = a_out_.get<float>() + qsz;
  batch.out_targets_dev = ClientIo::Targets(*in.client, in.plan + in.layout->client);
  batch.workspace_dev = a_ws_.get<void>();
  if (dev_.transforms_dev != nullptr) {
    batch.transforms_dev = dev_.transforms_dev;
    batch.transform_layers = dev_.transform_layers;
    batch.layer_dev = small + 3 * items;
    batch.values_folded = dev_.values_folded;
  }
  absl::Status st;
  if (hot) {
    gpu::LevelAttentionParams hp;
    hp.batch = batch;
    hp.pool_dev = static_cast<const uint8_t*>(dev_.hot_arena);
    hp.layout = dev_.hot_layout;
    hp.merge_counters_dev = merge_counters_.get<uint32_t>();
    hp.split_done = timer_.Event(StageTimer::kSplitDone);
    st = gpu::LaunchLevelAttention(hp, dev_.stream);
    for (AttendJob& j : jobs) j.route = AttendRoute::kHot;
  } else {
    gpu::DQuantAttentionParams p;
    p.batch = batch;
    p.pool_dev = static_cast<const uint8_t*>(dev_.arena);
    p.layout = dev_.layout;
    p.tables_dev = dev_.tables_dev;
    if (cold_levels_.enabled()) {
      // The table is packed in item order (AttendPlanned; a kept plan is
      // one it recorded).
      item_pages_.resize(items);
      for (int i = 0; i < items; ++i) item_pages_[i] = static_cast<int>(jobs[i].pages.size());
      st = cold_levels_.Attend(p, item_pages_, merge_counters_.get<uint32_t>(), dev_.stream);
      for (const ColdChunk& c : cold_levels_.chunks()) {
        for (int i = c.first_item; i < c.first_item + c.items; ++i) {
          jobs[i].route = c.levels ? AttendRoute::kColdLevels : AttendRoute::kColdFused;
        }
      }
    } else {
      st = gpu::LaunchDQuantAttention(p, dev_.stream);
      for (AttendJob& j : jobs) j.route = AttendRoute::kColdFused;
    }
  }
  if (!st.ok()) return st;
  timer_.Mark(StageTimer::kAttentionDone, dev_.stream);
  if (!ClientIo::AllOutputs(jobs)) {
    st =
        Cuda(cudaMemcpyAsync(host_out_.get<void>(), a_out_.get<void>(), out_bytes, cudaMemcpyDeviceToHost, dev_.stream),
             "download output");
  }
  const float* out = host_out_.get<float>();
  timer_.Mark(StageTimer::kOutputsDone, dev_.stream);
  AttendPhaseClock::Mark(AttendPhase::kBackendHost);
  if (st.ok()) st = Cuda(cudaStreamSynchronize(dev_.stream), "attention");
  AttendPhaseClock::Mark(AttendPhase::kDeviceWait);
  if (!st.ok()) return st;
  timer_.Collect();
  client_io_.FinishQueryChecks(*in.client, jobs);
  for (int i = 0; i < items; ++i) {
    jobs[i].status = absl::OkStatus();
    if (jobs[i].out_dev != nullptr) continue;
    std::memcpy(jobs[i].out, out + static_cast<size_t>(i) * q_heads * d, sizeof(float) * q_heads * d);
    std::memcpy(jobs[i].lse, out + qsz + static_cast<size_t>(i) * q_heads, sizeof(float) * q_heads);
  }
  return absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
