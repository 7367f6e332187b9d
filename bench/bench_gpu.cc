// GPU benchmark (docs/bench_gpu.md): fused D-Quant decode attention vs the project's
// bf16 paged kernel (SDPA is timed by bench/sdpa_bench.py in the same run),
// GPU encode throughput, and the capacity figures.
//
// Inputs: a few thousand distinct tokens are encoded on the CPU (codec/, about
// 50 us per stream and core) into kDistinctPages pages, which are then
// replicated on the GPU to fill every page of the pool; page tables are
// random permutations. To keep repeated launches from measuring the 60 MB L2,
// each launch uses another of R replicas of the whole batch (R chosen so the
// replicas total >= 512 MB). Times are CUDA-event medians over --reps
// launches after warm-up; each launch includes the split-merge kernel. The
// hot kernel is timed once more with the stream held while its launch is
// queued: the device's time alone, without the host's launch cost.
//
//   bench_gpu [--shapes=1x8192,32x8192,...] [--reps=30] [--csv=FILE]
//             [--encode_tokens=32768] [--window=128]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/check.h"
#include "codec/dquant_codec.h"
#include "codec/level_page.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/encode.h"
#include "kernels/level_attention.h"
#include "kernels/level_demote.h"
#include "kernels/level_promote.h"
#include "kernels/page_crc.h"
#include "kernels/testing/batch_builder.h"
#include "kernels/testing/device_buffer.h"
#include "kernels/transform.h"
#include "wire/half.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kKvHeads = 8, kHeadDim = 128, kQHeads = 32, kN = kKvHeads * kHeadDim;
constexpr int kDistinctPages = 32;  // 4096 distinct tokens
constexpr double kRotateBytes = 512.0 * (1 << 20);

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Shape {
  int batch, context;
};

// Random matrices in the device form of kernels/transform.h, one layer:
// timing only (the transform's cost does not depend on its values).
std::vector<float> RandomTransforms(std::mt19937_64* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(kHeadDim)));
  std::vector<float> m(static_cast<size_t>(kKvHeads) * 4 * kHeadDim * kHeadDim);
  for (float& x : m) x = normal(*rng);
  return m;
}

// Holds the stream for 300 us from the host (a host function sleeping):
// enough for the events and the launch queued behind it, so that their
// interval is the device's time alone.
void CUDART_CB HoldStream(void*) {
  std::this_thread::sleep_for(std::chrono::microseconds(300));
}

// With `gpu_only`, the stream is held while the events and the launch are
// queued (HoldStream): the host's launch cost, which the plain interval
// includes where the device waits for it (the launch-bound 1 x 8K), is
// left out. bench/sdpa_bench.py times SDPA both ways too.
template <typename F>
double MedianMs(int reps, F launch, bool gpu_only = false) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) launch(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    if (gpu_only) CHECK_CUDA(cudaLaunchHostFunc(nullptr, HoldStream, nullptr));
    CHECK_CUDA(cudaEventRecord(a));
    launch(i);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

// Distinct D-Quant pages encoded on the CPU with all host cores.
std::vector<uint8_t> EncodeDistinctPages(const DQuantCodec& codec, const PageLayout& lay) {
  std::vector<uint8_t> pages(static_cast<size_t>(kDistinctPages) * lay.page_bytes, 0);
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      std::mt19937_64 rng(1000 + w);
      CodecScratch scratch;
      std::vector<float> k, v;
      for (int pg = w; pg < kDistinctPages; pg += threads) {
        RandomKv(kPageTokens, kKvHeads, kHeadDim, &rng, &k, &v);
        uint8_t* page = pages.data() + static_cast<size_t>(pg) * lay.page_bytes;
        StreamStats ks, vs;
        CHECK_OK(codec.EncodeWindow(k.data(), v.data(), kPageTokens, page, page + lay.value_offset,
                                    page + lay.mean_offset, &scratch, &ks, &vs));
      }
    });
  }
  for (auto& t : pool) t.join();
  return pages;
}

// Fills `count` pages of `page_bytes` at pool_dev by cycling the distinct pages.
void Replicate(const DeviceBuffer& distinct, size_t page_bytes, uint8_t* pool_dev, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    CHECK_CUDA(cudaMemcpyAsync(pool_dev + i * page_bytes, distinct.get<uint8_t>() + (i % kDistinctPages) * page_bytes,
                               page_bytes, cudaMemcpyDeviceToDevice));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
}

struct Result {
  Shape shape;
  double dquant_ms, bf16_ms, dquant_bytes, bf16_bytes;
  double hot_ms, hot_bytes;      // level pages (the hot tier)
  double hot_in_ms, hot_two_ms;  // the window and merge forced into the launch / a second launch
  double hot_gpu_ms;             // hot_ms's launches, the device's time alone (MedianMs gpu_only)
  double cold_promoted_ms;       // the cold pages promoted to a scratch pool, then the level kernel
  double wush_ms;                // the D-Quant launch with a WUSH transform stage
  int dquant_splits_hint;
};

// The device inputs of one compressed-pages launch at shape s: R replicas of
// the batch's pages (R so that they total >= kRotateBytes: no L2 reuse
// between launches), random page tables, every item `comp` tokens in pages
// plus a `window`-token bf16 window, and the workspace.
struct PagedBatch {
  int replicas = 1, pages = 0;
  DeviceBuffer pool, perm, start, tokens, window, window_tokens, ws;
  // Launch i's page table: another replica each time.
  const int32_t* table(int i, int batch) const {
    return perm.get<int32_t>() + static_cast<size_t>(i % replicas) * batch * pages;
  }
  // The AttentionBatch of `batch` items over these pages (launch 0's page
  // table), the same for the cold and the hot kernel.
  AttentionBatch Attend(int batch, const DeviceBuffer& query, const DeviceBuffer& out, const DeviceBuffer& lse) const {
    AttentionBatch a;
    a.items = batch;
    a.q_heads = kQHeads;
    a.max_pages = pages;
    a.page_table_dev = table(0, batch);
    a.page_start_dev = start.get<int32_t>();
    a.tokens_dev = tokens.get<int32_t>();
    a.window_k_dev = window.get<uint16_t>();
    a.window_v_dev = window.get<uint16_t>();
    a.window_tokens_dev = window_tokens.get<int32_t>();
    a.query_dev = query.get<float>();
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    a.out_dev = out.get<float>();
    a.lse_dev = lse.get<float>();
    a.workspace_dev = ws.get<void>();
    return a;
  }
};

void MakePagedBatch(const Shape& s, int comp, int window, size_t page_bytes, const DeviceBuffer& distinct,
                    std::mt19937_64* rng, PagedBatch* b) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  b->pages = (comp + kPageTokens - 1) / kPageTokens;
  const double set = static_cast<double>(s.batch) * b->pages * page_bytes;
  b->replicas = std::max(1, static_cast<int>(std::ceil(kRotateBytes / set)));
  const size_t total = static_cast<size_t>(b->replicas) * s.batch * b->pages;
  b->pool.Resize(total * page_bytes);
  Replicate(distinct, page_bytes, b->pool.get<uint8_t>(), total);
  std::vector<int32_t> perm(total);
  for (size_t i = 0; i < total; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), *rng);
  std::vector<int32_t> start(s.batch), tokens(s.batch, comp), wt(s.batch, window);
  for (int i = 0; i < s.batch; ++i) start[i] = i * b->pages;
  std::vector<uint16_t> wk(static_cast<size_t>(s.batch) * kMaxWindow * kN);
  for (auto& x : wk) x = FloatToBf16(normal(*rng));
  b->perm.Upload(perm);
  b->start.Upload(start);
  b->tokens.Upload(tokens);
  b->window.Upload(wk);
  b->window_tokens.Upload(wt);
  b->ws.Resize(AttentionWorkspaceBytes(s.batch, kQHeads, kHeadDim, b->pages));
}

// Exits when a launch left a non-finite output.
void CheckFinite(const DeviceBuffer& out, const char* what) {
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> h;
  out.Download(&h);
  for (float x : h) {
    if (!std::isfinite(x)) {
      std::fprintf(stderr, "non-finite %s output\n", what);
      std::exit(1);
    }
  }
}

// Promotes `count` cold pages (ids 0..count-1 of cold_dev) to level pages
// (ids 0..count-1 of hot_dev) on the device.
PromoteParams PromoteAll(const DQuantCodec& codec, const PageLayout& lay, const LevelPageLayout& hl,
                         const uint8_t* cold_dev, uint8_t* hot_dev, int count, DeviceBuffer* ids, DeviceBuffer* toks,
                         DeviceBuffer* tabs) {
  std::vector<int32_t> id(count), tk(count, kPageTokens);
  for (int i = 0; i < count; ++i) id[i] = i;
  ids->Upload(id);
  toks->Upload(tk);
  tabs->Upload(PromoteDecodeTables(codec));
  PromoteParams pp;
  pp.cold_pool_dev = cold_dev;
  pp.cold = lay;
  pp.hot_pool_dev = hot_dev;
  pp.hot = hl;
  SetPromoteCodec(codec, tabs->get<uint32_t>(), &pp);
  pp.pages = count;
  pp.cold_pages_dev = ids->get<int32_t>();
  pp.hot_pages_dev = ids->get<int32_t>();
  pp.tokens_dev = toks->get<int32_t>();
  return pp;
}

Result RunShape(const Shape& s, const DQuantCodec& codec, const PageLayout& lay, const DeviceBuffer& dq_distinct,
                const LevelPageLayout& hl, const DeviceBuffer& hot_distinct, const DeviceBuffer& bf_distinct,
                const DeviceBuffer& tables, int window, int reps) {
  Result r{};
  r.shape = s;
  const int comp = s.context - window;
  const int dq_pages = (comp + kPageTokens - 1) / kPageTokens;
  const int bf_pages = (s.context + kPageTokens - 1) / kPageTokens;
  const size_t bf_page_bytes = Bf16PageBytes(kKvHeads, kHeadDim);
  const double bf_set = static_cast<double>(s.batch) * bf_pages * bf_page_bytes;
  const int rbf = std::max(1, static_cast<int>(std::ceil(kRotateBytes / bf_set)));
  std::mt19937_64 rng(s.batch * 131 + s.context);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<float> query(static_cast<size_t>(s.batch) * kQHeads * kHeadDim);
  for (float& q : query) q = normal(rng);
  DeviceBuffer dquery, out, lse;
  CHECK_CUDA(dquery.Upload(query) ? cudaSuccess : cudaErrorMemoryAllocation);
  out.Resize(query.size() * 4);
  lse.Resize(static_cast<size_t>(s.batch) * kQHeads * 4);

  // ---- D-Quant ----
  {
    PagedBatch b;
    MakePagedBatch(s, comp, window, lay.page_bytes, dq_distinct, &rng, &b);
    DQuantAttentionParams p;
    p.batch = b.Attend(s.batch, dquery, out, lse);
    p.pool_dev = b.pool.get<uint8_t>();
    p.layout = lay;
    p.tables_dev = tables.get<uint32_t>();
    r.dquant_ms = MedianMs(reps, [&](int i) {
      p.batch.page_table_dev = b.table(i, s.batch);
      CHECK_OK(LaunchDQuantAttention(p, nullptr));
    });
    // The same launch through a WUSH transform stage (query pre-transform
    // kernel, output transform in the merge): its overhead, side by side.
    DeviceBuffer dmats, dlayers;
    dmats.Upload(RandomTransforms(&rng));
    dlayers.Upload(std::vector<int32_t>(s.batch, 0));
    DQuantAttentionParams pw = p;
    pw.batch.transforms_dev = dmats.get<float>();
    pw.batch.transform_layers = 1;
    pw.batch.layer_dev = dlayers.get<int32_t>();
    r.wush_ms = MedianMs(reps, [&](int i) {
      pw.batch.page_table_dev = b.table(i, s.batch);
      CHECK_OK(LaunchDQuantAttention(pw, nullptr));
    });
    CheckFinite(out, "D-Quant");
    // The same cold pages attended another way: promoted first into a
    // scratch pool of level pages (the batch's pages, in the launch's page
    // table order), then the level kernel on them, both in the timing.
    // Every page here holds 128 tokens (comp is a multiple of 128 at the
    // default window), as PromoteAll's token counts say.
    {
      const int n = s.batch * b.pages;
      DeviceBuffer level(static_cast<size_t>(n) * hl.page_bytes), ids, toks, tabs, counters;
      PromoteParams pp = PromoteAll(codec, lay, hl, b.pool.get<uint8_t>(), level.get<uint8_t>(), n, &ids, &toks, &tabs);
      if (!counters.Upload(std::vector<uint32_t>(static_cast<size_t>(s.batch) * kKvHeads, 0u))) std::abort();
      LevelAttentionParams lp;
      lp.batch = p.batch;
      lp.batch.page_table_dev = ids.get<int32_t>();  // pages 0..n-1, item i's from i * pages
      lp.pool_dev = level.get<uint8_t>();
      lp.layout = hl;
      lp.merge_counters_dev = counters.get<uint32_t>();
      r.cold_promoted_ms = MedianMs(reps, [&](int i) {
        pp.cold_pages_dev = b.table(i, s.batch);
        CHECK_OK(LaunchPromote(pp, nullptr));
        CHECK_OK(LaunchLevelAttention(lp, nullptr));
      });
      CheckFinite(out, "promoted cold");
    }
    // Bytes the kernel must read: records and mean records of the compressed
    // tokens, plus the bf16 window.
    r.dquant_bytes =
        static_cast<double>(s.batch) * (static_cast<double>(comp) * (lay.key_stride + lay.value_stride) +
                                        static_cast<double>(dq_pages) * lay.mean_stride + 2.0 * window * kN * 2);
  }
  // ---- level pages (hot tier), the same tokens and window ----
  {
    PagedBatch b;
    MakePagedBatch(s, comp, window, hl.page_bytes, hot_distinct, &rng, &b);
    LevelAttentionParams p;
    p.batch = b.Attend(s.batch, dquery, out, lse);
    p.pool_dev = b.pool.get<uint8_t>();
    p.layout = hl;
    // The service's way (LevelMerge::kAuto), then the window and the merge
    // forced into the kernel's launch and into a second launch, back to back.
    DeviceBuffer counters;
    if (!counters.Upload(std::vector<uint32_t>(static_cast<size_t>(s.batch) * kKvHeads, 0u))) std::abort();
    p.merge_counters_dev = counters.get<uint32_t>();
    auto launch = [&](int i) {
      p.batch.page_table_dev = b.table(i, s.batch);
      CHECK_OK(LaunchLevelAttention(p, nullptr));
    };
    r.hot_ms = MedianMs(reps, launch);
    CheckFinite(out, "level-page");
    r.hot_gpu_ms = MedianMs(reps, launch, /*gpu_only=*/true);
    for (LevelMerge m : {LevelMerge::kInLaunch, LevelMerge::kSecondLaunch}) {
      LevelAttentionParams forced = p;
      forced.merge = m;
      (m == LevelMerge::kInLaunch ? r.hot_in_ms : r.hot_two_ms) = MedianMs(reps, [&](int i) {
        forced.batch.page_table_dev = b.table(i, s.batch);
        CHECK_OK(LaunchLevelAttention(forced, nullptr));
      });
    }
    r.hot_bytes =
        static_cast<double>(s.batch) *
        (static_cast<double>(dq_pages) * (hl.blocks_offset + hl.kv_heads * hl.head_bytes()) + 2.0 * window * kN * 2);
  }
  // ---- bf16 ----
  {
    const size_t total = static_cast<size_t>(rbf) * s.batch * bf_pages;
    DeviceBuffer pool(total * bf_page_bytes);
    Replicate(bf_distinct, bf_page_bytes, pool.get<uint8_t>(), total);
    std::vector<int32_t> perm(total);
    for (size_t i = 0; i < total; ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> start(s.batch), tokens(s.batch, s.context);
    for (int i = 0; i < s.batch; ++i) start[i] = i * bf_pages;
    DeviceBuffer dperm, dstart, dtok, ws;
    dperm.Upload(perm);
    dstart.Upload(start);
    dtok.Upload(tokens);
    ws.Resize(AttentionWorkspaceBytes(s.batch, kQHeads, kHeadDim, bf_pages));
    Bf16AttentionParams p;
    p.pool_dev = pool.get<uint8_t>();
    p.kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.items = s.batch;
    p.q_heads = kQHeads;
    p.max_pages = bf_pages;
    p.page_start_dev = dstart.get<int32_t>();
    p.tokens_dev = dtok.get<int32_t>();
    p.query_dev = dquery.get<float>();
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    p.out_dev = out.get<float>();
    p.lse_dev = lse.get<float>();
    p.workspace_dev = ws.get<void>();
    r.bf16_ms = MedianMs(reps, [&](int i) {
      p.page_table_dev = dperm.get<int32_t>() + static_cast<size_t>(i % rbf) * s.batch * bf_pages;
      CHECK_OK(LaunchBf16Attention(p, nullptr));
    });
    r.bf16_bytes = static_cast<double>(s.batch) * s.context * kN * 2 * 2;
  }
  return r;
}

void EncodeThroughput(const DQuantCodec& codec, int tokens, int reps) {
  EncodeParams ep;
  CHECK_OK(MakeEncodeAlphabets(codec, &ep));
  std::mt19937_64 rng(7);
  std::vector<float> k, v;
  RandomKv(4096, kKvHeads, kHeadDim, &rng, &k, &v);  // tiled: the GPU encodes each token's own copy
  std::vector<float> kk(static_cast<size_t>(tokens) * kN), vv(kk.size());
  for (size_t i = 0; i < kk.size(); ++i) {
    kk[i] = k[i % k.size()];
    vv[i] = v[i % v.size()];
  }
  const int pages = (tokens + kPageTokens - 1) / kPageTokens;
  std::vector<int32_t> ids(pages);
  for (int i = 0; i < pages; ++i) ids[i] = i;
  DeviceBuffer dk, dv, dids, pool, stats;
  dk.Upload(kk);
  dv.Upload(vv);
  dids.Upload(ids);
  pool.Resize(static_cast<size_t>(pages) * ep.layout.page_bytes);
  stats.Resize(sizeof(EncodeStreamStats) * 2 * tokens);
  ep.keys_dev = dk.get<float>();
  ep.values_dev = dv.get<float>();
  ep.tokens = tokens;
  ep.pages_dev = dids.get<int32_t>();
  ep.pool_dev = pool.get<uint8_t>();
  ep.stats_dev = stats.get<EncodeStreamStats>();
  const double ms = MedianMs(reps, [&](int) { CHECK_OK(LaunchEncode(ep, nullptr)); });
  // The WUSH stage in front of the encoder: T_K on the keys, T_V on the
  // values (kernels/transform.h), timed alone on the same tokens.
  DeviceBuffer dmats, dlayer, tk, tv;
  dmats.Upload(RandomTransforms(&rng));
  dlayer.Upload(std::vector<int32_t>(1, 0));
  tk.Resize(kk.size() * 4);
  tv.Resize(kk.size() * 4);
  HeadTransformParams tp;
  tp.mats_dev = dmats.get<float>();
  tp.layers = 1;
  tp.kv_heads = kKvHeads;
  tp.head_dim = kHeadDim;
  tp.rows = tokens;
  tp.heads = kKvHeads;
  tp.layer_dev = dlayer.get<int32_t>();
  tp.rows_per_layer = tokens;
  const double tms = MedianMs(reps, [&](int) {
    tp.matrix = kTfKey;
    tp.in_dev = dk.get<float>();
    tp.out_dev = tk.get<float>();
    CHECK_OK(LaunchHeadTransform(tp, nullptr));
    tp.matrix = kTfValue;
    tp.in_dev = dv.get<float>();
    tp.out_dev = tv.get<float>();
    CHECK_OK(LaunchHeadTransform(tp, nullptr));
  });
  std::vector<EncodeStreamStats> st(2 * tokens);
  CHECK_CUDA(cudaMemcpy(st.data(), stats.get<void>(), st.size() * sizeof(EncodeStreamStats), cudaMemcpyDeviceToHost));
  long retries = 0, fallbacks = 0, errors = 0;
  double used_k = 0, used_v = 0;
  for (int i = 0; i < 2 * tokens; ++i) {
    retries += st[i].retries;
    fallbacks += st[i].fallback != 0;
    errors += st[i].error;
    (i % 2 == 0 ? used_k : used_v) += st[i].bytes_used;
  }
  std::printf("\nGPU encode (n = %d, %d tokens = %d streams, mean window incl.): %.3f ms median of %d\n", kN, tokens,
              2 * tokens, ms, reps);
  std::printf(
      "  %.3g streams/s, %.3g tokens/s (per layer); retries %ld, fallbacks %ld, errors %ld; "
      "mean bytes used keys %.1f / %d, values %.1f / %d\n",
      2 * tokens / (ms * 1e-3), tokens / (ms * 1e-3), retries, fallbacks, errors, used_k / tokens,
      ep.keys.payload_bytes, used_v / tokens, ep.values.payload_bytes);
  std::printf("  WUSH transform of the same keys and values (before the encoder): %.3f ms, %+.1f%% of the encode\n",
              tms, 100.0 * tms / ms);
}

// Promotion of one 8K-token sequence (32 layers: 64 full pages each) from
// cold to level pages on the device.
void PromotionTime(const DQuantCodec& codec, const PageLayout& lay, const LevelPageLayout& hl,
                   const DeviceBuffer& dq_distinct, int reps) {
  constexpr int kPages = 32 * 64;
  DeviceBuffer cold(static_cast<size_t>(kPages) * lay.page_bytes), hot(static_cast<size_t>(kPages) * hl.page_bytes);
  Replicate(dq_distinct, lay.page_bytes, cold.get<uint8_t>(), kPages);
  DeviceBuffer ids, toks, tabs;
  PromoteParams pp = PromoteAll(codec, lay, hl, cold.get<uint8_t>(), hot.get<uint8_t>(), kPages, &ids, &toks, &tabs);
  const double ms = MedianMs(reps, [&](int) { CHECK_OK(LaunchPromote(pp, nullptr)); });
  std::printf(
      "\nPromotion of one 8K-token sequence (32 layers x 64 pages x 128 tokens, 8 x 128): %.3f ms median of %d "
      "(%.1f GB/s of level pages written)\n",
      ms, reps, kPages * static_cast<double>(hl.page_bytes) / (ms * 1e6));
  // Demotion of the same level pages back into cold pages, on the device;
  // checked against the cold pages they came from.
  CHECK_OK(LaunchPromote(pp, nullptr));
  DeviceBuffer back(static_cast<size_t>(kPages) * lay.page_bytes), status(static_cast<size_t>(kPages) * 4);
  DemoteParams dp;
  dp.hot_pool_dev = hot.get<uint8_t>();
  dp.hot = hl;
  dp.cold_pool_dev = back.get<uint8_t>();
  dp.cold = lay;
  SetDemoteTables(codec, &dp);
  dp.pages = kPages;
  dp.hot_pages_dev = pp.hot_pages_dev;
  dp.cold_pages_dev = pp.cold_pages_dev;
  dp.tokens_dev = pp.tokens_dev;
  dp.status_dev = status.get<int32_t>();
  const double dms = MedianMs(reps, [&](int) { CHECK_OK(LaunchDemote(dp, nullptr)); });
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> a, b;
  std::vector<int32_t> st;
  if (!cold.Download(&a) || !back.Download(&b) || !status.Download(&st)) {
    std::fprintf(stderr, "download failed\n");
    std::exit(1);
  }
  long bad = 0, differ = 0;
  for (int32_t v : st) bad += v != 0;
  const size_t used = lay.mean_offset + lay.mean_stride;  // records and mean record; the rest is padding
  for (int k = 0; k < kPages; ++k)
    differ += std::memcmp(a.data() + k * lay.page_bytes, b.data() + k * lay.page_bytes, used) != 0;
  std::printf(
      "Demotion of the same on the device: %.3f ms median of %d (%.1f GB/s of cold pages written); "
      "%ld pages failed, %ld of %d differ from the cold pages promoted\n",
      dms, reps, kPages * static_cast<double>(lay.page_bytes) / (dms * 1e6), bad, differ, kPages);
  // The checksums a checked promotion adds (backends/cuda: the cold pages'
  // before, the level pages' after, in the same stream), and the three
  // launches as the CUDA backend queues them.
  DeviceBuffer sums(static_cast<size_t>(2 * kPages) * 4);
  PageCrcParams cc, hc;
  cc.arena_dev = cold.get<uint8_t>();
  cc.page_bytes = lay.page_bytes;
  cc.pages_dev = pp.cold_pages_dev;
  cc.pages = kPages;
  cc.sums_dev = sums.get<uint32_t>();
  hc = cc;
  hc.arena_dev = hot.get<uint8_t>();
  hc.page_bytes = hl.page_bytes;
  hc.pages_dev = pp.hot_pages_dev;
  hc.sums_dev = sums.get<uint32_t>() + kPages;
  const double cms = MedianMs(reps, [&](int) { CHECK_OK(LaunchPageCrc(cc, nullptr)); });
  const double hms = MedianMs(reps, [&](int) { CHECK_OK(LaunchPageCrc(hc, nullptr)); });
  const double all = MedianMs(reps, [&](int) {
    CHECK_OK(LaunchPageCrc(cc, nullptr));
    CHECK_OK(LaunchPromote(pp, nullptr));
    CHECK_OK(LaunchPageCrc(hc, nullptr));
  });
  // The cold sums on a second stream beside the promotion, which reads
  // the same pages and does not wait for their sums (the backend checks
  // them on the host afterwards).
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const double beside = MedianMs(reps, [&](int) {
    CHECK_CUDA(cudaEventRecord(fork, nullptr));
    CHECK_CUDA(cudaStreamWaitEvent(side, fork, 0));
    CHECK_OK(LaunchPageCrc(cc, side));
    CHECK_CUDA(cudaEventRecord(join, side));
    CHECK_OK(LaunchPromote(pp, nullptr));
    CHECK_OK(LaunchPageCrc(hc, nullptr));
    CHECK_CUDA(cudaStreamWaitEvent(nullptr, join, 0));
  });
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  std::printf(
      "Checksums of the same pages on the device: cold %.3f ms (%.1f GB/s), level %.3f ms (%.1f GB/s); "
      "checked promotion (cold sums, promotion, level sums) %.3f ms, with the cold sums on a second stream "
      "%.3f ms, medians of %d\n",
      cms, kPages * static_cast<double>(lay.page_bytes) / (cms * 1e6), hms,
      kPages * static_cast<double>(hl.page_bytes) / (hms * 1e6), all, beside, reps);
}

void Capacity(const PageLayout& lay, const LevelPageLayout& hl, int window) {
  constexpr int kLayers = 32;
  constexpr double kPool = 64.0 * (1ull << 30);
  const double bf16_tok = 2.0 * kN * 2;  // bytes per token per layer
  auto dquant_seq = [&](int context) {   // bytes per sequence, every layer, every side table
    const int comp = std::max(0, context - window);
    const int pages = (comp + kPageTokens - 1) / kPageTokens;
    return kLayers * (static_cast<double>(pages) * lay.page_bytes + window * bf16_tok + pages * 4.0 /*page table*/);
  };
  auto bf16_seq = [&](int context) {
    const int pages = (context + kPageTokens - 1) / kPageTokens;
    return kLayers * (static_cast<double>(pages) * Bf16PageBytes(kKvHeads, kHeadDim) + pages * 4.0);
  };
  std::printf(
      "\nCapacity (32 layers, 8 kv heads x 128, pages of 128 tokens, D-Quant page %zu B incl. mean record "
      "and padding, bf16 window %d tokens, page tables 4 B/page):\n",
      lay.page_bytes, window);
  const int b16 = static_cast<int>(kPool / bf16_seq(8192)), bdq = static_cast<int>(kPool / dquant_seq(8192));
  std::printf("  8K-token sequences in a 64 GiB pool: bf16 %d, D-Quant %d (%.2fx)\n", b16, bdq,
              static_cast<double>(bdq) / b16);
  const double t16 = 65536.0 / (bf16_seq(65536) / (1ull << 30)), tdq = 65536.0 / (dquant_seq(65536) / (1ull << 30));
  std::printf("  tokens per GiB at 64K-token sequences: bf16 %.0f, D-Quant %.0f (%.2fx)\n", t16, tdq, tdq / t16);
  std::printf("  bytes per token per layer: bf16 %.0f, D-Quant records %d + %d + mean %.2f = %.2f (page %.2f)\n",
              bf16_tok, lay.key_stride, lay.value_stride, lay.mean_stride / 128.0,
              lay.key_stride + lay.value_stride + lay.mean_stride / 128.0, lay.page_bytes / 128.0);
  std::printf(
      "  level page (hot tier) %zu B = %.2f B per token: %.2fx bf16 tokens per byte (cold page %.2fx); "
      "hot page / cold page %.3f\n",
      hl.page_bytes, hl.page_bytes / 128.0, bf16_tok * 128.0 / hl.page_bytes, bf16_tok * 128.0 / lay.page_bytes,
      static_cast<double>(hl.page_bytes) / lay.page_bytes);
}

int Main(int argc, char** argv) {
  std::vector<Shape> shapes = {{1, 8192}, {32, 8192}, {64, 8192}, {128, 8192}, {1, 131072}, {16, 32768}};
  // window: the service's default window_tokens (R = 128); it holds R .. R + 127 tokens.
  int reps = 30, encode_tokens = 32768, window = 128;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--reps=", 0) == 0)
      reps = std::stoi(a.substr(7));
    else if (a.rfind("--csv=", 0) == 0)
      csv = a.substr(6);
    else if (a.rfind("--encode_tokens=", 0) == 0)
      encode_tokens = std::stoi(a.substr(16));
    else if (a.rfind("--window=", 0) == 0)
      window = std::stoi(a.substr(9));
    else if (a.rfind("--shapes=", 0) == 0) {
      shapes.clear();
      std::string l = a.substr(9);
      size_t pos = 0;
      while (pos < l.size()) {
        size_t e = l.find(',', pos);
        if (e == std::string::npos) e = l.size();
        const std::string tok = l.substr(pos, e - pos);
        const size_t x = tok.find('x');
        shapes.push_back({std::stoi(tok.substr(0, x)), std::stoi(tok.substr(x + 1))});
        pos = e + 1;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (!GpuAvailable()) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  DQuantConfig cfg;
  cfg.kv_heads = kKvHeads;
  cfg.head_dim = kHeadDim;
  auto codec = DQuantCodec::Create(cfg);
  CHECK_OK(codec.status());
  const PageLayout lay = codec->page_layout();  // the service's pages (codec/page_layout.h)
  if (const std::string error = GpuPageLayoutError(lay, PageUse::kAttend); !error.empty())
    CHECK_OK(absl::InvalidArgumentError(error));
  std::vector<uint32_t> tab(512);
  PackDecodeTable(codec->key_codec().table(), tab.data());
  PackDecodeTable(codec->value_codec().table(), tab.data() + 256);
  DeviceBuffer tables, dq_distinct, bf_distinct;
  tables.Upload(tab);
  dq_distinct.Upload(EncodeDistinctPages(*codec, lay));
  auto hl = MakeLevelPageLayout(*codec);
  CHECK_OK(hl.status());
  DeviceBuffer hot_distinct(static_cast<size_t>(kDistinctPages) * hl->page_bytes);
  {
    DeviceBuffer ids, toks, tabs;
    PromoteParams pp = PromoteAll(*codec, lay, *hl, dq_distinct.get<uint8_t>(), hot_distinct.get<uint8_t>(),
                                  kDistinctPages, &ids, &toks, &tabs);
    CHECK_OK(LaunchPromote(pp, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> bf(static_cast<size_t>(kDistinctPages) * Bf16PageBytes(kKvHeads, kHeadDim) / 2);
    for (auto& x : bf) x = FloatToBf16(normal(rng));
    bf_distinct.Upload(bf);
  }
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (out)
    std::fprintf(out,
                 "batch,context,dquant_ms,bf16_ms,dquant_bytes,bf16_bytes,wush_ms,hot_ms,hot_bytes,hot_in_launch_ms,"
                 "hot_two_launch_ms,hot_gpu_ms,cold_promoted_ms\n");
  std::printf("\n%6s %8s | %10s %8s %10s %10s | %10s %8s | %10s %8s | %12s | %-24s | %s\n", "batch", "context",
              "hot ms", "GB/s", "in launch", "2 launches", "D-Quant ms", "GB/s", "bf16 ms", "GB/s", "bf16/hot",
              "D-Quant+WUSH ms", "hot ms, device alone | cold promoted + hot ms");
  for (const Shape& s : shapes) {
    const Result r = RunShape(s, *codec, lay, dq_distinct, *hl, hot_distinct, bf_distinct, tables, window, reps);
    char wush[40];
    std::snprintf(wush, sizeof(wush), "%.4f (%+.1f%%)", r.wush_ms, 100.0 * (r.wush_ms / r.dquant_ms - 1.0));
    std::printf("%6d %8d | %10.4f %8.0f %10.4f %10.4f | %10.4f %8.0f | %10.4f %8.0f | %11.2fx | %-24s | %.4f | %.4f\n",
                s.batch, s.context, r.hot_ms, r.hot_bytes / (r.hot_ms * 1e6), r.hot_in_ms, r.hot_two_ms, r.dquant_ms,
                r.dquant_bytes / (r.dquant_ms * 1e6), r.bf16_ms, r.bf16_bytes / (r.bf16_ms * 1e6), r.bf16_ms / r.hot_ms,
                wush, r.hot_gpu_ms, r.cold_promoted_ms);
    std::fflush(stdout);
    if (out) {
      std::fprintf(out, "%d,%d,%.6f,%.6f,%.0f,%.0f,%.6f,%.6f,%.0f,%.6f,%.6f,%.6f,%.6f\n", s.batch, s.context,
                   r.dquant_ms, r.bf16_ms, r.dquant_bytes, r.bf16_bytes, r.wush_ms, r.hot_ms, r.hot_bytes, r.hot_in_ms,
                   r.hot_two_ms, r.hot_gpu_ms, r.cold_promoted_ms);
    }
  }
  if (out) std::fclose(out);
  if (encode_tokens > 0) EncodeThroughput(*codec, encode_tokens, std::max(5, reps / 3));
  PromotionTime(*codec, lay, *hl, dq_distinct, std::max(5, reps / 3));
  Capacity(lay, *hl, window);
  return 0;
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::gpu::Main(argc, argv);
}
