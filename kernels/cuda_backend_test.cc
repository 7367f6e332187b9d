// The CUDA backend against the CPU backend on one PagePool: pages encoded on
// the GPU are mirrored to the host, decode there, and attention over them
// (pages + bf16 window) agrees with the CPU backend's.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "codec/half.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cuda_backend.h"
#include "kernels/host_pool.h"
#include "service/backend.h"
#include "service/page_pool.h"

namespace driftkv {
namespace {

TEST(CudaBackend, MatchesCpuBackend) {
  if (!gpu::GpuAvailable()) {
    std::printf("skipped: no GPU\n");
    GTEST_SKIP() << "skipped: no GPU";
  }
  DQuantConfig cfg;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  const int n = codec->n(), P = cfg.mean_window, q_heads = 32, d = 128;
  DQuantCodec c = *codec;
  auto pool = PagePool::Create(&c, 40ull * 80000);  // about 40 pages
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
    gpu::RandomKv(seq_pages[s] * P, n, &rng, &keys[s], &values[s]);
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
}

}  // namespace
}  // namespace driftkv
