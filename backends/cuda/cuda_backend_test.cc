// The CUDA backend against the CPU backend on one PagePool: pages encoded on
// the GPU are mirrored to the host, decode there, and attention over them
// (pages + bf16 window) agrees with the CPU backend's.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/page_pool.h"
#include "codec/dquant_kv_codec.h"
#include "codec/level_page.h"
#include "codec/registry.h"
#include "codec/transform/transform.h"
#include "codec/transform/transform_attention.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/testing/batch_builder.h"
#include "kernels/testing/gpu_test_util.h"
#include "wire/half.h"

namespace driftkv {
namespace {

TEST(CudaBackend, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  const int n = codec->n(), P = cfg.mean_window, q_heads = 32, d = 128;
  DQuantCodec c = *codec;
  auto pool = PagePool::Create(c.page_layout(), 40ull * 80000);  // about 40 pages
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto cuda = MakeCudaBackend(&c, pool->get());
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  auto cpu = MakeCpuBackend(&c, pool->get(), 4);

  const std::vector<int> seq_pages = {1, 5, 9};
  const std::vector<int> windows = {0, 7, 255};  // up to window_tokens + page_tokens - 1
  std::mt19937_64 rng(77);
  std::vector<std::vector<PageId>> pages(seq_pages.size());
  std::vector<std::vector<float>> keys(seq_pages.size()), values(seq_pages.size());
  std::vector<EncodeJob> jobs;
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    auto r = (*pool)->Reserve(seq_pages[s]);
    ASSERT_TRUE(r.ok());
    pages[s] = *r;
    gpu::RandomKv(seq_pages[s] * P, c.config().kv_heads, c.config().head_dim, &rng, &keys[s], &values[s]);
    for (int k = 0; k < seq_pages[s]; ++k) {
      EncodeJob j;
      j.keys = keys[s].data() + static_cast<size_t>(k) * P * n;
      j.values = values[s].data() + static_cast<size_t>(k) * P * n;
      j.page = pages[s][k];
      jobs.push_back(j);
    }
  }
  absl::Status st = (*cuda)->EncodePages(absl::MakeSpan(jobs));
  ASSERT_TRUE(st.ok()) << st;
  for (const EncodeJob& j : jobs) {
    EXPECT_EQ(j.stats.keys.streams, P);
    EXPECT_LE(j.stats.keys.bytes_used, j.stats.keys.bytes_budget);
    // Drift statistics and per-stream utilisation reach the metrics.
    EXPECT_GT(j.stats.values.moved, 0);
    EXPECT_GE(j.stats.values.max_move, 1);
    ASSERT_EQ(j.key_utilization.size(), static_cast<size_t>(P));
    ASSERT_EQ(j.value_utilization.size(), static_cast<size_t>(P));
    for (int t = 0; t < P; ++t) {
      EXPECT_GT(j.key_utilization[t], 0.5f);
      EXPECT_LE(j.key_utilization[t], 1.0f);
      EXPECT_LE(j.value_utilization[t], 1.0f);
    }
  }
  // Every GPU-written token decodes on the host.
  std::vector<float> k(static_cast<size_t>(P) * n), v(k.size());
  for (const auto& ps : pages) {
    for (PageId p : ps) ASSERT_TRUE((*cuda)->DecodeTokens(p, 0, 0, P, k.data(), v.data()).ok());
  }

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> wk(seq_pages.size()), wv(seq_pages.size());
  std::vector<std::vector<float>> q(seq_pages.size());
  std::vector<float> out_gpu(seq_pages.size() * q_heads * d, NAN), out_cpu(out_gpu.size(), NAN);
  std::vector<float> lse_gpu(seq_pages.size() * q_heads, NAN), lse_cpu(lse_gpu.size(), NAN);
  std::vector<AttendJob> ag(seq_pages.size()), ac(seq_pages.size());
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    wk[s].resize(static_cast<size_t>(windows[s]) * n);
    wv[s].resize(wk[s].size());
    for (auto& x : wk[s]) x = FloatToBf16(normal(rng));
    for (auto& x : wv[s]) x = FloatToBf16(normal(rng));
    q[s].resize(static_cast<size_t>(q_heads) * d);
    for (float& x : q[s]) x = normal(rng);
    for (int which = 0; which < 2; ++which) {
      AttendJob& j = which == 0 ? ag[s] : ac[s];
      j.pages = pages[s];
      j.window = Bf16Tokens{wk[s].data(), wv[s].data(), windows[s]};
      j.query = q[s].data();
      j.q_heads = q_heads;
      j.softmax_scale = 1.0f / std::sqrt(128.0f);
      j.out = (which == 0 ? out_gpu : out_cpu).data() + s * q_heads * d;
      j.lse = (which == 0 ? lse_gpu : lse_cpu).data() + s * q_heads;
    }
  }
  (*cuda)->Attend(absl::MakeSpan(ag));
  cpu->Attend(absl::MakeSpan(ac));
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    ASSERT_TRUE(ag[s].status.ok()) << ag[s].status;
    ASSERT_TRUE(ac[s].status.ok()) << ac[s].status;
  }
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out_gpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out_gpu[i])) << i;
    diff = std::max(diff, static_cast<double>(std::fabs(out_gpu[i] - out_cpu[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(out_cpu[i])));
  }
  EXPECT_LE(diff, 1e-4 * norm) << "max |gpu - cpu| " << diff << ", max |cpu| " << norm;
  for (size_t i = 0; i < lse_gpu.size(); ++i) EXPECT_NEAR(lse_gpu[i], lse_cpu[i], 1e-4 * (1 + std::fabs(lse_cpu[i])));

  // Launches of one shape, call after call, reuse the backend's staging
  // and plans: with other queries each time, every answer equals the one
  // its queries got in a call of another shape.
  std::vector<std::vector<float>> other(seq_pages.size());
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    other[s].resize(q[s].size());
    for (float& x : other[s]) x = normal(rng);
  }
  // The other queries' answers, item by item (other shapes: issued one by
  // one; answers are batch-invariant).
  std::vector<float> out_other(out_gpu.size(), NAN), lse_other(lse_gpu.size(), NAN);
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    AttendJob j = ag[s];
    j.query = other[s].data();
    j.out = out_other.data() + s * q_heads * d;
    j.lse = lse_other.data() + s * q_heads;
    (*cuda)->Attend(absl::MakeSpan(&j, 1));
    ASSERT_TRUE(j.status.ok()) << j.status;
  }
  EXPECT_NE(out_other, out_gpu) << "other queries, the same answers";
  for (int call = 0; call < 6; ++call) {
    const bool use_other = call % 2 == 1;
    std::vector<float> out(out_gpu.size(), NAN), lse(lse_gpu.size(), NAN);
    for (size_t s = 0; s < seq_pages.size(); ++s) {
      ag[s].query = (use_other ? other[s] : q[s]).data();
      ag[s].out = out.data() + s * q_heads * d;
      ag[s].lse = lse.data() + s * q_heads;
    }
    (*cuda)->Attend(absl::MakeSpan(ag));
    for (size_t s = 0; s < seq_pages.size(); ++s) ASSERT_TRUE(ag[s].status.ok()) << ag[s].status;
    const std::vector<float>& want_out = use_other ? out_other : out_gpu;
    const std::vector<float>& want_lse = use_other ? lse_other : lse_gpu;
    EXPECT_EQ(std::memcmp(out.data(), want_out.data(), out.size() * 4), 0) << "call " << call;
    EXPECT_EQ(std::memcmp(lse.data(), want_lse.data(), lse.size() * 4), 0) << "call " << call;
  }
}

// WUSH on the GPU: pages bit-identical to the CPU transform stage (T applied
// by LayerTransform, then the identity-rotation codec), Read in the model
// domain, attention equal to TransformedCompressedAttention, items of two
// layers in one launch.
TEST(CudaBackend, WushMatchesCpuTransformStage) {
  SKIP_WITHOUT_GPU();
  const TransformSet set = gpu::RandomWushSet(2, 8, 128, 5);
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  cfg.hadamard = false;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  DQuantCodec c = *codec;
  const int n = c.n(), P = cfg.mean_window, q_heads = 32, d = 128;
  auto pool = PagePool::Create(c.page_layout(), 12ull * 80000);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto cuda = MakeCudaBackend(&c, pool->get(), 0, &set, false);
  ASSERT_TRUE(cuda.ok()) << cuda.status();

  // A Hadamard codec is refused with transforms.
  {
    DQuantConfig hc = cfg;
    hc.hadamard = true;
    auto had = DQuantCodec::Create(hc);
    ASSERT_TRUE(had.ok());
    auto hpool = PagePool::Create(had->page_layout(), 2ull * 80000);
    ASSERT_TRUE(hpool.ok());
    EXPECT_EQ(MakeCudaBackend(&*had, hpool->get(), 0, &set, false).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }

  const std::vector<int> seq_pages = {3, 2};
  const std::vector<int> seq_layer = {0, 1};
  const std::vector<int> windows = {0, 9};
  std::mt19937_64 rng(91);
  std::vector<std::vector<PageId>> pages(2);
  std::vector<std::vector<float>> keys(2), values(2);
  std::vector<EncodeJob> jobs;
  for (int s = 0; s < 2; ++s) {
    auto r = (*pool)->Reserve(seq_pages[s]);
    ASSERT_TRUE(r.ok());
    pages[s] = *r;
    gpu::RandomKv(seq_pages[s] * P, c.config().kv_heads, c.config().head_dim, &rng, &keys[s], &values[s]);
    for (int k = 0; k < seq_pages[s]; ++k) {
      EncodeJob j;
      j.keys = keys[s].data() + static_cast<size_t>(k) * P * n;
      j.values = values[s].data() + static_cast<size_t>(k) * P * n;
      j.page = pages[s][k];
      j.layer = seq_layer[s];
      jobs.push_back(j);
    }
  }
  EncodeJob bad = jobs[0];
  bad.layer = 2;
  EXPECT_EQ((*cuda)->EncodePages(absl::MakeSpan(&bad, 1)).code(), absl::StatusCode::kInvalidArgument);
  absl::Status st = (*cuda)->EncodePages(absl::MakeSpan(jobs));
  ASSERT_TRUE(st.ok()) << st;

  // Bit-identical pages: T on the host (LayerTransform), then EncodeWindow.
  std::vector<uint8_t> kr(P * c.key_stride()), vr(P * c.value_stride()), mr(c.mean_stride());
  std::vector<float> tk(static_cast<size_t>(P) * n), tv(tk.size());
  CodecScratch scratch;
  for (const EncodeJob& j : jobs) {
    const LayerTransform lt = *LayerTransform::FromSet(set, j.layer);
    lt.Apply(Mat::kKey, j.keys, P, tk.data());
    lt.Apply(Mat::kValue, j.values, P, tv.data());
    StreamStats ks, vs;
    ASSERT_TRUE(c.EncodeWindow(tk.data(), tv.data(), P, kr.data(), vr.data(), mr.data(), &scratch, &ks, &vs).ok());
    EXPECT_EQ(std::memcmp(kr.data(), (*pool)->key_records(j.page), kr.size()), 0) << "key records of page " << j.page;
    EXPECT_EQ(std::memcmp(vr.data(), (*pool)->value_records(j.page), vr.size()), 0)
        << "value records of page " << j.page;
    EXPECT_EQ(std::memcmp(mr.data(), (*pool)->mean_record(j.page), mr.size()), 0) << "mean record of page " << j.page;
  }
  // Read gives the model domain back, within the codec's error.
  {
    std::vector<float> k(static_cast<size_t>(P) * n), v(k.size());
    ASSERT_TRUE((*cuda)->DecodeTokens(jobs[3].page, 1, 0, P, k.data(), v.data()).ok());
    double ek = 0, nk = 0, ev = 0, nv = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      ek += (k[i] - jobs[3].keys[i]) * (k[i] - jobs[3].keys[i]), nk += jobs[3].keys[i] * jobs[3].keys[i];
      ev += (v[i] - jobs[3].values[i]) * (v[i] - jobs[3].values[i]), nv += jobs[3].values[i] * jobs[3].values[i];
    }
    EXPECT_LT(ek / nk, 0.2);
    EXPECT_LT(ev / nv, 0.3);
    std::printf("WUSH read nmse: keys %.4f values %.4f\n", ek / nk, ev / nv);
  }

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> wk(2), wv(2);
  std::vector<std::vector<float>> q(2);
  std::vector<float> out_gpu(2 * q_heads * d, NAN), lse_gpu(2 * q_heads, NAN);
  std::vector<AttendJob> ag(2);
  for (int s = 0; s < 2; ++s) {
    wk[s].resize(static_cast<size_t>(windows[s]) * n);
    wv[s].resize(wk[s].size());
    for (auto& x : wk[s]) x = FloatToBf16(normal(rng));
    for (auto& x : wv[s]) x = FloatToBf16(normal(rng));
    q[s].resize(static_cast<size_t>(q_heads) * d);
    for (float& x : q[s]) x = normal(rng);
    AttendJob& j = ag[s];
    j.pages = pages[s];
    j.window = Bf16Tokens{wk[s].data(), wv[s].data(), windows[s]};
    j.query = q[s].data();
    j.q_heads = q_heads;
    j.softmax_scale = 1.0f / std::sqrt(128.0f);
    j.layer = seq_layer[s];
    j.out = out_gpu.data() + s * q_heads * d;
    j.lse = lse_gpu.data() + s * q_heads;
  }
  (*cuda)->Attend(absl::MakeSpan(ag));
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(ag[s].status.ok()) << ag[s].status;
    CodecOptions o;
    o.kv_heads = 8;
    o.head_dim = 128;
    auto tc = MakeTransformedCodec(o, TransformKind::kWush, &set, seq_layer[s], false);
    ASSERT_TRUE(tc.ok()) << tc.status();
    const auto* tkv = dynamic_cast<const TransformedKvCodec*>(tc->get());
    ASSERT_NE(tkv, nullptr);
    std::vector<CompressedBlock> blocks;
    for (PageId p : pages[s]) {
      blocks.push_back(CompressedBlock{(*pool)->key_records(p), (*pool)->value_records(p), (*pool)->mean_record(p), P});
    }
    std::vector<float> out_ref(q_heads * d), lse_ref(q_heads);
    AttentionScratch as;
    ASSERT_TRUE(TransformedCompressedAttention(*tkv, blocks, ag[s].window, q[s].data(), q_heads, ag[s].softmax_scale,
                                               out_ref.data(), lse_ref.data(), &as)
                    .ok());
    double diff = 0, norm = 0;
    for (int i = 0; i < q_heads * d; ++i) {
      const float g = out_gpu[s * q_heads * d + i];
      ASSERT_TRUE(std::isfinite(g)) << i;
      diff = std::max(diff, static_cast<double>(std::fabs(g - out_ref[i])));
      norm = std::max(norm, static_cast<double>(std::fabs(out_ref[i])));
    }
    EXPECT_LE(diff, 1e-4 * norm) << "sequence " << s << ": max |gpu - cpu| " << diff << ", max |cpu| " << norm;
    for (int h = 0; h < q_heads; ++h) {
      EXPECT_NEAR(lse_gpu[s * q_heads + h], lse_ref[h], 1e-4 * (1 + std::fabs(lse_ref[h])));
    }
  }
  // An item whose layer has no transform fails alone, with its layer named.
  AttendJob j = ag[0];
  j.layer = 7;
  (*cuda)->Attend(absl::MakeSpan(&j, 1));
  EXPECT_EQ(j.status.code(), absl::StatusCode::kInvalidArgument);
}

// The hot tier on the device: pages promoted on the GPU, attended with the
// level-page kernel (agreeing with the CPU backend), read back
// bit-identically to their cold form, and demoted back to the very same
// cold bytes; a batch that mixes hot and cold jobs, answered the same twice.
TEST(CudaBackend, HotTierRoundTrip) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  DQuantCodec c = *codec;
  const int n = c.n(), P = cfg.mean_window, q_heads = 32, d = 128;
  auto hl = MakeLevelPageLayout(c);
  ASSERT_TRUE(hl.ok()) << hl.status();
  auto pool = PagePool::Create(c.page_layout(), 30ull * c.page_layout().page_bytes);
  auto hot_pool = PagePool::CreateOpaque(hl->page_bytes, P, 30ull * hl->page_bytes);
  ASSERT_TRUE(pool.ok() && hot_pool.ok());
  auto cuda = MakeCudaBackend(&c, pool->get(), 0, nullptr, false, kDefaultWindowCacheBytes, hot_pool->get());
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ASSERT_TRUE((*cuda)->SupportsHotTier());
  auto cpu = MakeCpuBackend(&c, pool->get(), 4);

  const std::vector<int> seq_pages = {3, 6};
  std::mt19937_64 rng(78);
  std::vector<std::vector<PageId>> cold(seq_pages.size());
  std::vector<std::vector<float>> keys(seq_pages.size()), values(seq_pages.size());
  std::vector<EncodeJob> jobs;
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    auto r = (*pool)->Reserve(seq_pages[s]);
    ASSERT_TRUE(r.ok());
    cold[s] = *r;
    gpu::RandomKv(seq_pages[s] * P, cfg.kv_heads, cfg.head_dim, &rng, &keys[s], &values[s]);
    for (int k = 0; k < seq_pages[s]; ++k) {
      EncodeJob j;
      j.keys = keys[s].data() + static_cast<size_t>(k) * P * n;
      j.values = values[s].data() + static_cast<size_t>(k) * P * n;
      j.page = cold[s][k];
      jobs.push_back(j);
    }
  }
  ASSERT_TRUE((*cuda)->EncodePages(absl::MakeSpan(jobs)).ok());
  // The cold bytes and cold Read of sequence 0, before promotion.
  const size_t cold_bytes = c.page_layout().page_bytes;
  std::vector<std::vector<uint8_t>> original;
  for (PageId p : cold[0]) original.emplace_back((*pool)->page(p), (*pool)->page(p) + cold_bytes);
  std::vector<float> rk_cold(static_cast<size_t>(P) * n), rv_cold(rk_cold.size());
  ASSERT_TRUE((*cuda)->DecodeTokens(cold[0][1], 0, 0, P, rk_cold.data(), rv_cold.data()).ok());

  // Attend everything cold, on the GPU and the CPU.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> wk(seq_pages.size()), wv(seq_pages.size());
  std::vector<std::vector<float>> q(seq_pages.size());
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    wk[s].resize(static_cast<size_t>(130) * n);
    wv[s].resize(wk[s].size());
    for (auto& x : wk[s]) x = FloatToBf16(normal(rng));
    for (auto& x : wv[s]) x = FloatToBf16(normal(rng));
    q[s].resize(static_cast<size_t>(q_heads) * d);
    for (float& x : q[s]) x = normal(rng);
  }
  auto attend = [&](Backend* b, const std::vector<std::vector<PageId>>& pages, const std::vector<bool>& hot,
                    std::vector<float>* out, std::vector<float>* lse) {
    out->assign(seq_pages.size() * q_heads * d, NAN);
    lse->assign(seq_pages.size() * q_heads, NAN);
    std::vector<AttendJob> js(seq_pages.size());
    for (size_t s = 0; s < seq_pages.size(); ++s) {
      js[s].pages = pages[s];
      js[s].hot = hot[s];
      js[s].window = Bf16Tokens{wk[s].data(), wv[s].data(), 130};
      js[s].query = q[s].data();
      js[s].q_heads = q_heads;
      js[s].softmax_scale = 1.0f / std::sqrt(128.0f);
      js[s].out = out->data() + s * q_heads * d;
      js[s].lse = lse->data() + s * q_heads;
    }
    b->Attend(absl::MakeSpan(js));
    for (const AttendJob& j : js) ASSERT_TRUE(j.status.ok()) << j.status;
  };
  std::vector<float> out_cold, lse_cold, out_cpu, lse_cpu;
  attend(cuda->get(), cold, {false, false}, &out_cold, &lse_cold);
  attend(cpu.get(), cold, {false, false}, &out_cpu, &lse_cpu);

  // Promote sequence 0 on the device; the cold pages go back to the pool.
  auto hot0 = (*hot_pool)->Reserve(seq_pages[0]);
  ASSERT_TRUE(hot0.ok());
  std::vector<TierMove> moves;
  for (int k = 0; k < seq_pages[0]; ++k) moves.push_back(TierMove{cold[0][k], (*hot0)[k], P});
  ASSERT_TRUE((*cuda)->PromotePages(moves).ok());
  // (That the device's level pages equal the CPU's PromotePage byte for byte
  // is kernels/level_attention_test's; here: Read and demotion below.)
  (*pool)->Free(cold[0]);
  std::vector<float> rk_hot(rk_cold.size()), rv_hot(rk_cold.size());
  ASSERT_TRUE((*cuda)->DecodeHotTokens((*hot0)[1], 0, 0, P, rk_hot.data(), rv_hot.data()).ok());
  EXPECT_EQ(0, std::memcmp(rk_hot.data(), rk_cold.data(), rk_cold.size() * 4)) << "Read keys differ between tiers";
  EXPECT_EQ(0, std::memcmp(rv_hot.data(), rv_cold.data(), rv_cold.size() * 4)) << "Read values differ between tiers";

  // A mixed batch: sequence 0 hot, sequence 1 cold.
  std::vector<std::vector<PageId>> mixed = {*hot0, cold[1]};
  std::vector<float> out_mixed, lse_mixed;
  attend(cuda->get(), mixed, {true, false}, &out_mixed, &lse_mixed);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out_mixed.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out_mixed[i])) << i;
    diff = std::max(diff, static_cast<double>(std::fabs(out_mixed[i] - out_cpu[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(out_cpu[i])));
  }
  EXPECT_LE(diff, 1e-4 * norm) << "hot vs CPU: max diff " << diff;
  // The cold job of the mixed batch is bit-identical to its all-cold run.
  EXPECT_EQ(0, std::memcmp(out_mixed.data() + q_heads * d, out_cold.data() + q_heads * d, q_heads * d * 4));
  // Again: the hot job gives the same bits a second time.
  std::vector<float> out_again, lse_again;
  attend(cuda->get(), mixed, {true, false}, &out_again, &lse_again);
  EXPECT_EQ(0, std::memcmp(out_again.data(), out_mixed.data(), out_mixed.size() * 4));

  // Demote into fresh cold pages: the original bytes again, decoding alike.
  auto back = (*pool)->Reserve(seq_pages[0]);
  ASSERT_TRUE(back.ok());
  moves.clear();
  for (int k = 0; k < seq_pages[0]; ++k) moves.push_back(TierMove{(*hot0)[k], (*back)[k], P});
  ASSERT_TRUE((*cuda)->DemotePages(moves).ok());
  (*hot_pool)->Free(*hot0);
  for (int k = 0; k < seq_pages[0]; ++k) {
    EXPECT_EQ(0, std::memcmp((*pool)->page((*back)[k]), original[k].data(), cold_bytes)) << "demoted page " << k;
  }
  std::vector<std::vector<PageId>> recold = {*back, cold[1]};
  std::vector<float> out_recold, lse_recold;
  attend(cuda->get(), recold, {false, false}, &out_recold, &lse_recold);
  EXPECT_EQ(0, std::memcmp(out_recold.data(), out_cold.data(), out_cold.size() * 4)) << "after demotion";
}

// Cold launches through the level page scratch (backends/cuda/cold_levels.h):
// a cold item's answer is the one its pages give once promoted to the hot
// tier, bit for bit, alone or in a batch; with a scratch too small for the
// batch, chunks give the same bits, and an item larger than the scratch
// gets the fused kernel's; with none, the fused kernel, which agrees with
// the CPU backend.
TEST(CudaBackend, ColdThroughLevelPages) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  DQuantCodec c = *codec;
  const int n = c.n(), P = cfg.mean_window, q_heads = 32, d = 128;
  auto hl = MakeLevelPageLayout(c);
  ASSERT_TRUE(hl.ok()) << hl.status();
  const std::vector<int> seq_pages = {3, 6, 2, 0, 5, 1};
  const int total = 17, items = static_cast<int>(seq_pages.size());
  auto pool = PagePool::Create(c.page_layout(), 20ull * c.page_layout().page_bytes);
  auto hot_pool = PagePool::CreateOpaque(hl->page_bytes, P, 20ull * hl->page_bytes);
  ASSERT_TRUE(pool.ok() && hot_pool.ok());
  // levels: the default scratch; small: four level pages; fused: none.
  auto levels = MakeCudaBackend(&c, pool->get(), 0, nullptr, false, kDefaultWindowCacheBytes, hot_pool->get());
  auto small =
      MakeCudaBackend(&c, pool->get(), 0, nullptr, false, kDefaultWindowCacheBytes, nullptr, 0, 4 * hl->page_bytes);
  auto fused = MakeCudaBackend(&c, pool->get(), 0, nullptr, false, kDefaultWindowCacheBytes, nullptr, 0, 0);
  ASSERT_TRUE(levels.ok() && small.ok() && fused.ok());
  auto cpu = MakeCpuBackend(&c, pool->get(), 4);

  std::mt19937_64 rng(91);
  std::vector<std::vector<PageId>> cold(items);
  std::vector<EncodeJob> jobs;
  std::vector<float> keys, values;
  gpu::RandomKv(total * P, cfg.kv_heads, cfg.head_dim, &rng, &keys, &values);
  int at = 0;
  for (int s = 0; s < items; ++s) {
    auto r = (*pool)->Reserve(seq_pages[s]);
    ASSERT_TRUE(r.ok());
    cold[s] = *r;
    for (int k = 0; k < seq_pages[s]; ++k, ++at) {
      EncodeJob j;
      j.keys = keys.data() + static_cast<size_t>(at) * P * n;
      j.values = values.data() + static_cast<size_t>(at) * P * n;
      j.page = cold[s][k];
      jobs.push_back(j);
    }
  }
  ASSERT_TRUE((*levels)->EncodePages(absl::MakeSpan(jobs)).ok());
  std::vector<PageId> all;
  for (const auto& p : cold) all.insert(all.end(), p.begin(), p.end());
  ASSERT_TRUE((*small)->UploadPages(all).ok());
  ASSERT_TRUE((*fused)->UploadPages(all).ok());

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> wk(items), wv(items);
  std::vector<std::vector<float>> q(items);
  const int window = 100;
  for (int s = 0; s < items; ++s) {
    wk[s].resize(static_cast<size_t>(window) * n);
    wv[s].resize(wk[s].size());
    for (auto& x : wk[s]) x = FloatToBf16(normal(rng));
    for (auto& x : wv[s]) x = FloatToBf16(normal(rng));
    q[s].resize(static_cast<size_t>(q_heads) * d);
    for (float& x : q[s]) x = normal(rng);
  }
  const size_t rows = static_cast<size_t>(q_heads) * d;
  // Items `which` attended in one call; out is [items] rows, NaN where not
  // attended; route[s] says how item s was attended (AttendJob::route).
  std::vector<AttendRoute> route(items);
  auto attend = [&](Backend* b, const std::vector<std::vector<PageId>>& pages, bool hot, const std::vector<int>& which,
                    std::vector<float>* out, std::vector<float>* lse) {
    route.assign(items, AttendRoute::kUnreported);
    out->assign(items * rows, NAN);
    lse->assign(static_cast<size_t>(items) * q_heads, NAN);
    std::vector<AttendJob> js(which.size());
    for (size_t k = 0; k < which.size(); ++k) {
      const int s = which[k];
      js[k].pages = pages[s];
      js[k].hot = hot;
      js[k].window = Bf16Tokens{wk[s].data(), wv[s].data(), window};
      js[k].query = q[s].data();
      js[k].q_heads = q_heads;
      js[k].softmax_scale = 1.0f / std::sqrt(128.0f);
      js[k].out = out->data() + s * rows;
      js[k].lse = lse->data() + static_cast<size_t>(s) * q_heads;
    }
    b->Attend(absl::MakeSpan(js));
    for (size_t k = 0; k < which.size(); ++k) {
      ASSERT_TRUE(js[k].status.ok()) << js[k].status;
      route[which[k]] = js[k].route;
    }
  };
  auto routes_are = [&](const std::string& what, const std::function<AttendRoute(int)>& want) {
    for (int s = 0; s < items; ++s) {
      EXPECT_EQ(AttendRouteName(route[s]), std::string(AttendRouteName(want(s)))) << what << ", item " << s;
    }
  };
  const std::vector<int> every = {0, 1, 2, 3, 4, 5};
  auto same_item = [&](const std::vector<float>& a, const std::vector<float>& b, int s) {
    return std::memcmp(a.data() + s * rows, b.data() + s * rows, rows * 4) == 0;
  };
  std::vector<float> out_levels, lse_levels, out_small, lse_small, out_fused, lse_fused, out_cpu, lse_cpu;
  attend(levels->get(), cold, false, every, &out_levels, &lse_levels);
  routes_are("levels", [](int) { return AttendRoute::kColdLevels; });
  attend(small->get(), cold, false, every, &out_small, &lse_small);
  routes_are("small", [&](int s) { return seq_pages[s] <= 4 ? AttendRoute::kColdLevels : AttendRoute::kColdFused; });
  attend(fused->get(), cold, false, every, &out_fused, &lse_fused);
  routes_are("fused", [](int) { return AttendRoute::kColdFused; });
  attend(cpu.get(), cold, false, every, &out_cpu, &lse_cpu);
  routes_are("cpu", [](int) { return AttendRoute::kColdHost; });
  for (int s = 0; s < items; ++s) {
    // Alone, the same bits as in the batch.
    std::vector<float> out_one, lse_one;
    attend(levels->get(), cold, false, {s}, &out_one, &lse_one);
    EXPECT_TRUE(same_item(out_one, out_levels, s)) << "item " << s << " alone";
    // Four pages of scratch: items of up to four pages through the levels
    // (in chunks), the others fused.
    EXPECT_TRUE(same_item(out_small, seq_pages[s] <= 4 ? out_levels : out_fused, s)) << "item " << s << ", small";
  }
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out_cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out_levels[i]) && std::isfinite(out_fused[i])) << i;
    diff = std::max(diff, static_cast<double>(std::fabs(out_levels[i] - out_cpu[i])));
    diff = std::max(diff, static_cast<double>(std::fabs(out_fused[i] - out_cpu[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(out_cpu[i])));
  }
  EXPECT_LE(diff, 1e-4 * norm) << "levels and fused vs CPU: max diff " << diff;

  // Promoted to the hot tier: the same bits as through the scratch.
  std::vector<std::vector<PageId>> hot(items);
  std::vector<TierMove> moves;
  for (int s = 0; s < items; ++s) {
    auto r = (*hot_pool)->Reserve(seq_pages[s]);
    ASSERT_TRUE(r.ok());
    hot[s] = *r;
    for (int k = 0; k < seq_pages[s]; ++k) moves.push_back(TierMove{cold[s][k], hot[s][k], P});
  }
  ASSERT_TRUE((*levels)->PromotePages(moves).ok());
  std::vector<float> out_hot, lse_hot;
  attend(levels->get(), hot, true, every, &out_hot, &lse_hot);
  routes_are("hot", [](int) { return AttendRoute::kHot; });
  EXPECT_EQ(0, std::memcmp(out_hot.data(), out_levels.data(), out_hot.size() * 4)) << "hot vs cold through levels";
  EXPECT_EQ(0, std::memcmp(lse_hot.data(), lse_levels.data(), lse_hot.size() * 4)) << "lse, hot vs cold";
}

// A hot layer's new pages encoded straight into level pages on the device:
// the same checksums (of the cold records and of the level page) and
// statistics as the CPU backend's, which tests/encode_level_pages_test
// holds to encoding cold and promoting; Read from them alike; demoted on
// the device, the CPU's cold pages byte for byte.
TEST(CudaBackend, EncodeLevelPagesMatchesCpu) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  DQuantCodec c = *DQuantCodec::Create(cfg);
  const int n = c.n(), P = cfg.mean_window, pages = 5;
  const LevelPageLayout hl = *MakeLevelPageLayout(c);
  auto pool = *PagePool::Create(c.page_layout(), 4ull * pages * c.page_layout().page_bytes);
  auto hot_pool = *PagePool::CreateOpaque(hl.page_bytes, P, 4ull * pages * hl.page_bytes);
  auto cuda = MakeCudaBackend(&c, pool.get(), 0, nullptr, false, kDefaultWindowCacheBytes, hot_pool.get());
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  DQuantKvCodec kv_codec(c);
  BackendArgs args;
  args.codec = &kv_codec;
  args.pool = pool.get();
  args.threads = 4;
  args.hot_pool = hot_pool.get();
  auto cpu = MakeCpuBackend(args);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::mt19937_64 rng(91);
  std::vector<float> keys, values;
  gpu::RandomKv(pages * P, cfg.kv_heads, cfg.head_dim, &rng, &keys, &values);
  struct Run {
    std::vector<PageId> cold, hot;
    std::vector<EncodeJob> jobs;
    std::vector<PageChecksum> cold_sums, hot_sums;
  };
  auto run = [&](Backend* b) {
    Run r;
    r.cold = *pool->Reserve(pages);
    r.hot = *hot_pool->Reserve(pages);
    r.jobs.resize(pages);
    for (int k = 0; k < pages; ++k) {
      r.jobs[k].keys = keys.data() + static_cast<size_t>(k) * P * n;
      r.jobs[k].values = values.data() + static_cast<size_t>(k) * P * n;
      r.jobs[k].page = r.cold[k];
    }
    r.cold_sums.resize(pages);
    r.hot_sums.resize(pages);
    absl::Status st =
        b->EncodeLevelPages(absl::MakeSpan(r.jobs), r.hot, *pool, *hot_pool, r.cold_sums.data(), r.hot_sums.data());
    EXPECT_TRUE(st.ok()) << b->name() << ": " << st;
    return r;
  };
  const Run want = run(cpu->get()), got = run(cuda->get());
  for (int k = 0; k < pages; ++k) {
    SCOPED_TRACE(::testing::Message() << "page " << k);
    EXPECT_EQ(got.cold_sums[k], want.cold_sums[k]);
    EXPECT_EQ(got.hot_sums[k], want.hot_sums[k]);
    EXPECT_EQ(got.jobs[k].stats.keys.bytes_used, want.jobs[k].stats.keys.bytes_used);
    EXPECT_EQ(got.jobs[k].stats.values.bytes_used, want.jobs[k].stats.values.bytes_used);
  }
  // The device's checksums are of the device's level pages.
  std::vector<PageChecksum> again(pages);
  ASSERT_TRUE((*cuda)->ChecksumPages(*hot_pool, got.hot, again.data()).ok());
  EXPECT_EQ(again, got.hot_sums);
  std::vector<float> k1(static_cast<size_t>(P) * n), v1(k1.size()), k2(k1.size()), v2(k1.size());
  ASSERT_TRUE((*cpu)->DecodeHotTokens(want.hot[3], 0, 0, P, k1.data(), v1.data()).ok());
  ASSERT_TRUE((*cuda)->DecodeHotTokens(got.hot[3], 0, 0, P, k2.data(), v2.data()).ok());
  EXPECT_EQ(0, std::memcmp(k1.data(), k2.data(), k1.size() * 4));
  EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), v1.size() * 4));
  // Demoted on the device into fresh cold pages (mirrored to the host).
  const std::vector<PageId> back = *pool->Reserve(pages);
  std::vector<TierMove> moves;
  for (int k = 0; k < pages; ++k) moves.push_back(TierMove{got.hot[k], back[k], P});
  ASSERT_TRUE((*cuda)->DemotePages(moves).ok());
  for (int k = 0; k < pages; ++k) {
    EXPECT_EQ(0, std::memcmp(pool->page(back[k]), pool->page(want.cold[k]), c.page_layout().page_bytes))
        << "demoted page " << k;
  }
}

// Level sums handed back after the promotion (PromotePagesCheckedLater):
// the same cold sums as a checked promotion, and level sums, once waited
// for, equal to its and to ChecksumPages of the level pages; a second such
// promotion (more pages: the backend's buffer grows) settles the first's
// before it takes the buffer, and both stay right.
TEST(CudaBackend, LevelSumsLaterMatchTheCheckedPromotion) {
  SKIP_WITHOUT_GPU();
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  DQuantCodec c = *DQuantCodec::Create(cfg);
  const int n = c.n(), P = cfg.mean_window, pages = 6;
  const LevelPageLayout hl = *MakeLevelPageLayout(c);
  auto pool = *PagePool::Create(c.page_layout(), 2ull * pages * c.page_layout().page_bytes);
  auto hot_pool = *PagePool::CreateOpaque(hl.page_bytes, P, 4ull * pages * hl.page_bytes);
  auto cuda = MakeCudaBackend(&c, pool.get(), 0, nullptr, false, kDefaultWindowCacheBytes, hot_pool.get());
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  std::mt19937_64 rng(93);
  std::vector<float> keys, values;
  gpu::RandomKv(pages * P, cfg.kv_heads, cfg.head_dim, &rng, &keys, &values);
  const std::vector<PageId> cold = *pool->Reserve(pages);
  std::vector<EncodeJob> jobs(pages);
  for (int k = 0; k < pages; ++k) {
    jobs[k].keys = keys.data() + static_cast<size_t>(k) * P * n;
    jobs[k].values = values.data() + static_cast<size_t>(k) * P * n;
    jobs[k].page = cold[k];
  }
  ASSERT_TRUE((*cuda)->EncodePages(absl::MakeSpan(jobs)).ok());
  auto moves_to = [&](const std::vector<PageId>& hot, int count) {
    std::vector<TierMove> m;
    for (int k = 0; k < count; ++k) m.push_back(TierMove{cold[k], hot[k], P});
    return m;
  };
  const std::vector<PageId> h1 = *hot_pool->Reserve(pages), h2 = *hot_pool->Reserve(pages),
                            h3 = *hot_pool->Reserve(pages);
  std::vector<PageChecksum> cold_want(pages), hot_want(pages);
  ASSERT_TRUE(
      (*cuda)->PromotePagesChecked(moves_to(h1, pages), *pool, *hot_pool, cold_want.data(), hot_want.data()).ok());
  std::vector<PageChecksum> cold2(pages), cold3(pages), unused(pages, 0);
  std::shared_ptr<PendingChecksums> later2, later3;
  ASSERT_TRUE(
      (*cuda)->PromotePagesCheckedLater(moves_to(h2, 2), *pool, *hot_pool, cold2.data(), unused.data(), &later2).ok());
  ASSERT_NE(later2, nullptr);
  ASSERT_TRUE(
      (*cuda)
          ->PromotePagesCheckedLater(moves_to(h3, pages), *pool, *hot_pool, cold3.data(), unused.data(), &later3)
          .ok());
  ASSERT_NE(later3, nullptr);
  EXPECT_EQ(unused, std::vector<PageChecksum>(pages, 0)) << "hot_sums is left alone";
  for (int k = 0; k < 2; ++k) EXPECT_EQ(cold2[k], cold_want[k]) << k;
  EXPECT_EQ(cold3, cold_want);
  absl::StatusOr<absl::Span<const PageChecksum>> got3 = later3->Wait(), got2 = later2->Wait();
  ASSERT_TRUE(got3.ok()) << got3.status();
  ASSERT_TRUE(got2.ok()) << got2.status();
  EXPECT_EQ(std::vector<PageChecksum>(got3->begin(), got3->end()), hot_want);
  ASSERT_EQ(got2->size(), 2u);
  for (int k = 0; k < 2; ++k) EXPECT_EQ((*got2)[k], hot_want[k]) << k;
  std::vector<PageChecksum> again(pages);
  ASSERT_TRUE((*cuda)->ChecksumPages(*hot_pool, h3, again.data()).ok());
  EXPECT_EQ(again, hot_want);
}

}  // namespace
}  // namespace driftkv
