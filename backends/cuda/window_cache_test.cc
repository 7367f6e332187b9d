// The CUDA backend's device window cache, its window uploads and its kept
// launch plans (backends/cuda/attend_launcher.h, launch_plans.h) against
// the CPU backend on one pool: every step of growing, moving and repeated
// windows, and every reuse of a kept plan, answers as the CPU backend and
// as a fresh launch do.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/page_pool.h"
#include "codec/registry.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/testing/batch_builder.h"
#include "kernels/testing/gpu_test_util.h"
#include "wire/half.h"

namespace driftkv {
namespace {

// The window cache tests' setting: a codec of 4 KV heads x 128, a pool,
// the CUDA backend with a window cache of `slots` slots beside the CPU
// backend on the same pool, and one page of random tokens (drawn from
// `rng`) encoded on the GPU, which every sequence shares.
struct SharedPage {
  std::unique_ptr<DQuantCodec> codec;
  std::unique_ptr<PagePool> pool;
  std::unique_ptr<Backend> cuda, cpu;
  std::vector<PageId> pages;
};

void MakeSharedPage(int slots, std::mt19937_64* rng, SharedPage* out) {
  DQuantConfig cfg;
  cfg.kv_heads = 4;
  cfg.head_dim = 128;
  auto codec = DQuantCodec::Create(cfg);
  ASSERT_TRUE(codec.ok());
  out->codec = std::make_unique<DQuantCodec>(*codec);
  const DQuantCodec& c = *out->codec;
  auto pool = PagePool::Create(c.page_layout(), 8ull * 40000);
  ASSERT_TRUE(pool.ok()) << pool.status();
  out->pool = *std::move(pool);
  const size_t slot_bytes = static_cast<size_t>(gpu::kMaxWindow) * c.n() * 2;
  auto cuda = MakeCudaBackend(&c, out->pool.get(), 0, nullptr, false, slots * 2 * slot_bytes);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  out->cuda = *std::move(cuda);
  out->cpu = MakeCpuBackend(&c, out->pool.get(), 4);
  auto r = out->pool->Reserve(1);
  ASSERT_TRUE(r.ok());
  out->pages = *r;
  std::vector<float> k, v;
  gpu::RandomKv(cfg.mean_window, cfg.kv_heads, cfg.head_dim, rng, &k, &v);
  EncodeJob j;
  j.keys = k.data();
  j.values = v.data();
  j.page = out->pages[0];
  std::vector<EncodeJob> js = {j};
  ASSERT_TRUE(out->cuda->EncodePages(absl::MakeSpan(js)).ok());
}

// The device window cache (backends/cuda/window_cache.h): windows that grow
// by a token per step, move past a page, repeat within a launch, and more
// windows than slots (the staging fallback) give the CPU backend's results
// at every step.
TEST(CudaBackend, WindowCacheFollowsGrowingAndMovingWindows) {
  SKIP_WITHOUT_GPU();
  // One encoded page shared by every sequence; windows of up to 640 tokens
  // of history, viewed 128..255 at a time; 3 cache slots.
  std::mt19937_64 rng(5);
  SharedPage sp;
  ASSERT_NO_FATAL_FAILURE(MakeSharedPage(3, &rng, &sp));
  const int n = sp.codec->n(), q_heads = 8, d = 128;
  const std::vector<PageId>& pages = sp.pages;
  Backend* cuda = sp.cuda.get();
  Backend* cpu = sp.cpu.get();
  constexpr int kSeqs = 5, kHistory = 640;
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> hk(kSeqs), hv(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    hk[s].resize(static_cast<size_t>(kHistory) * n);
    hv[s].resize(hk[s].size());
    for (auto& x : hk[s]) x = FloatToBf16(g(rng));
    for (auto& x : hv[s]) x = FloatToBf16(g(rng));
  }
  std::vector<int64_t> first(kSeqs, 0), count(kSeqs);
  for (int s = 0; s < kSeqs; ++s) count[s] = 128 + 20 * s;
  std::vector<float> q(static_cast<size_t>(q_heads) * d);
  int checked = 0;
  for (int step = 0; step < 40; ++step) {
    // Sequences 0-2 every step (fit the 3 slots), all 5 every 4th step
    // (fallback), sequence 1 twice in one launch every 5th step, and every
    // 6th a new window that evicts one the same launch reads.
    std::vector<int> which = {0, 1, 2};
    if (step % 4 == 3) which = {0, 1, 2, 3, 4};
    if (step % 5 == 4) which = {1, 0, 1};
    // A miss that takes the least recently used slot, whose window is read
    // later in the same launch (which must then miss too, not read the slot).
    if (step % 6 == 5) which = {3, 2};  // sequence 2 holds the least recently used slot
    std::vector<AttendJob> ag(which.size()), ac(which.size());
    std::vector<float> og(which.size() * q_heads * d, NAN), oc(og.size(), NAN);
    std::vector<float> lg(which.size() * q_heads, NAN), lc(lg.size(), NAN);
    for (float& x : q) x = g(rng);
    for (size_t i = 0; i < which.size(); ++i) {
      const int s = which[i];
      for (int side = 0; side < 2; ++side) {
        AttendJob& j = side == 0 ? ag[i] : ac[i];
        j.pages = pages;
        j.window = Bf16Tokens{hk[s].data() + first[s] * n, hv[s].data() + first[s] * n, count[s]};
        j.window_id = 100 + s;
        j.window_first = first[s];
        j.query = q.data();
        j.q_heads = q_heads;
        j.softmax_scale = 1.0f / std::sqrt(128.0f);
        j.out = (side == 0 ? og : oc).data() + i * q_heads * d;
        j.lse = (side == 0 ? lg : lc).data() + i * q_heads;
      }
    }
    cuda->Attend(absl::MakeSpan(ag));
    cpu->Attend(absl::MakeSpan(ac));
    double diff = 0, norm = 0;
    for (size_t i = 0; i < og.size(); ++i) {
      ASSERT_TRUE(std::isfinite(og[i])) << "step " << step;
      diff = std::max(diff, static_cast<double>(std::fabs(og[i] - oc[i])));
      norm = std::max(norm, static_cast<double>(std::fabs(oc[i])));
    }
    for (size_t i = 0; i < which.size(); ++i) ASSERT_TRUE(ag[i].status.ok()) << ag[i].status;
    EXPECT_LE(diff, 1e-4 * norm) << "step " << step;
    ++checked;
    // Grow every window by one token; a window past 255 tokens moves on by
    // a page, as the handler's does when it encodes one.
    for (int s = 0; s < kSeqs; ++s) {
      if (count[s] + 1 > 255) {
        first[s] += 128;
        count[s] -= 128;
      }
      ++count[s];
      ASSERT_LE(first[s] + count[s], kHistory);
    }
  }
  EXPECT_EQ(checked, 40);
}

// Window tokens that take several rounds of the upload ring (window_upload.h):
// 96 new windows of up to 255 tokens (~24 MiB of keys and values, the ring's
// halves hold 4 MiB), half of them cached beforehand (CacheWindows), then
// one token more for each (96 uploads, more than one scatter launch's
// segments): the CPU backend's answers at both steps.
TEST(CudaBackend, WindowUploadsSpanningManyRounds) {
  SKIP_WITHOUT_GPU();
  constexpr int kSeqs = 96;
  std::mt19937_64 rng(17);
  SharedPage sp;
  ASSERT_NO_FATAL_FAILURE(MakeSharedPage(kSeqs, &rng, &sp));
  const int n = sp.codec->n(), q_heads = 8, d = 128;
  const std::vector<PageId>& pages = sp.pages;
  Backend* cuda = sp.cuda.get();
  Backend* cpu = sp.cpu.get();
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> hk(kSeqs), hv(kSeqs);
  std::vector<int64_t> count(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    count[s] = 1 + (s * 37) % 254;  // 1..254, one token left to grow
    hk[s].resize(static_cast<size_t>(gpu::kMaxWindow) * n);
    hv[s].resize(hk[s].size());
    for (auto& x : hk[s]) x = FloatToBf16(g(rng));
    for (auto& x : hv[s]) x = FloatToBf16(g(rng));
  }
  std::vector<float> q(static_cast<size_t>(kSeqs) * q_heads * d);
  for (int step = 0; step < 2; ++step) {
    for (float& x : q) x = g(rng);
    std::vector<AttendJob> ag(kSeqs), ac(kSeqs);
    std::vector<float> og(static_cast<size_t>(kSeqs) * q_heads * d, NAN), oc(og.size(), NAN);
    std::vector<float> lg(static_cast<size_t>(kSeqs) * q_heads, NAN), lc(lg.size(), NAN);
    for (int s = 0; s < kSeqs; ++s) {
      for (int side = 0; side < 2; ++side) {
        AttendJob& j = side == 0 ? ag[s] : ac[s];
        j.pages = pages;
        j.window = Bf16Tokens{hk[s].data(), hv[s].data(), count[s]};
        j.window_id = 1000 + s;
        j.window_first = 0;
        j.query = q.data() + static_cast<size_t>(s) * q_heads * d;
        j.q_heads = q_heads;
        j.softmax_scale = 1.0f / std::sqrt(128.0f);
        j.out = (side == 0 ? og : oc).data() + static_cast<size_t>(s) * q_heads * d;
        j.lse = (side == 0 ? lg : lc).data() + static_cast<size_t>(s) * q_heads;
      }
    }
    if (step == 0) {
      // Half the windows put on the device beforehand (Prefetch): the
      // Attend must find them there, the others it uploads itself.
      ASSERT_TRUE(cuda->CacheWindows(absl::MakeConstSpan(ag).subspan(0, kSeqs / 2)).ok());
    }
    cuda->Attend(absl::MakeSpan(ag));
    cpu->Attend(absl::MakeSpan(ac));
    for (int s = 0; s < kSeqs; ++s) ASSERT_TRUE(ag[s].status.ok()) << ag[s].status;
    for (int s = 0; s < kSeqs; ++s) {
      double diff = 0, norm = 0;
      for (size_t i = static_cast<size_t>(s) * q_heads * d; i < static_cast<size_t>(s + 1) * q_heads * d; ++i) {
        ASSERT_TRUE(std::isfinite(og[i])) << "step " << step << " sequence " << s;
        diff = std::max(diff, static_cast<double>(std::fabs(og[i] - oc[i])));
        norm = std::max(norm, static_cast<double>(std::fabs(oc[i])));
      }
      EXPECT_LE(diff, 1e-4 * norm) << "step " << step << " sequence " << s;
    }
    for (int s = 0; s < kSeqs; ++s) ++count[s];
  }
}

// Launch plans kept on the device (launch_plans.h): a launch of the same
// jobs as an earlier one reuses its plan, with queries and outputs in
// client memory (bf16 and f32), on the host, or both. Every launch is made
// twice with the same queries (the second reuses the first's plan, or both
// reuse an older one): the two answer the same bits, and the CPU backend's
// answer within its bound. Between rounds the plan goes stale in each way
// it can: a page id changed in place, window slots taken by another
// launch, a window grown. A non-finite query found by a reused plan's
// gather is reported, and not again once the query is finite.
TEST(CudaBackend, KeptLaunchPlansAnswerAsFreshOnes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(23);
  SharedPage sp;
  ASSERT_NO_FATAL_FAILURE(MakeSharedPage(5, &rng, &sp));
  // A second page, so that an item's page can change in place.
  auto more = sp.pool->Reserve(1);
  ASSERT_TRUE(more.ok());
  {
    std::vector<float> k, v;
    gpu::RandomKv(DQuantConfig().mean_window, 4, 128, &rng, &k, &v);
    EncodeJob j;
    j.keys = k.data();
    j.values = v.data();
    j.page = (*more)[0];
    std::vector<EncodeJob> js = {j};
    ASSERT_TRUE(sp.cuda->EncodePages(absl::MakeSpan(js)).ok());
  }
  const int n = sp.codec->n(), q_heads = 8, d = 128, qe = q_heads * d;
  constexpr int kItems = 4;
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> hk(kItems + 4), hv(kItems + 4);
  for (size_t s = 0; s < hk.size(); ++s) {
    hk[s].resize(static_cast<size_t>(gpu::kMaxWindow) * n);
    hv[s].resize(hk[s].size());
    for (auto& x : hk[s]) x = FloatToBf16(g(rng));
    for (auto& x : hv[s]) x = FloatToBf16(g(rng));
  }
  // Item i: query in client memory (bf16, f32, -, bf16), output in client
  // memory (f32, bf16, -, -); each item's pages a list of its own.
  const int q_dtype[kItems] = {1, 3, 0, 1}, o_dtype[kItems] = {3, 1, 0, 0};
  std::vector<std::vector<PageId>> pages(kItems, sp.pages);
  std::vector<int64_t> wtok = {100, 120, 140, 160};
  void* q_dev = nullptr;
  void* o_dev = nullptr;
  ASSERT_EQ(cudaMalloc(&q_dev, kItems * qe * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o_dev, kItems * (qe + q_heads) * 4), cudaSuccess);
  auto q_at = [&](int i) { return static_cast<uint8_t*>(q_dev) + static_cast<size_t>(i) * qe * 4; };
  auto o_at = [&](int i) { return static_cast<uint8_t*>(o_dev) + static_cast<size_t>(i) * (qe + q_heads) * 4; };
  std::vector<float> q(static_cast<size_t>(kItems) * qe);
  auto jobs = [&](std::vector<float>* host_out, bool cpu) {
    std::vector<AttendJob> js(kItems);
    for (int i = 0; i < kItems; ++i) {
      AttendJob& j = js[i];
      j.pages = pages[i];
      j.window = Bf16Tokens{hk[i].data(), hv[i].data(), wtok[i]};
      j.window_id = 700 + i;
      j.q_heads = q_heads;
      j.softmax_scale = 1.0f / std::sqrt(128.0f);
      j.query = q.data() + static_cast<size_t>(i) * qe;
      j.out = host_out->data() + static_cast<size_t>(i) * (qe + q_heads);
      j.lse = j.out + qe;
      j.check_query = true;
      if (cpu) continue;
      if (q_dtype[i] != 0) {
        j.query_dev = q_at(i);
        j.query_dtype = q_dtype[i];
      }
      if (o_dtype[i] != 0) {
        j.out_dev = o_at(i);
        j.out_dtype = o_dtype[i];
        j.lse_dev = reinterpret_cast<float*>(o_at(i) + static_cast<size_t>(qe) * 4);
      }
    }
    return js;
  };
  // Every item's answer as floats: host outputs, or client memory read back.
  auto answers = [&](const std::vector<float>& host_out) {
    std::vector<float> a(host_out);
    for (int i = 0; i < kItems; ++i) {
      if (o_dtype[i] == 0) continue;
      std::vector<uint8_t> raw((qe + q_heads) * 4);
      EXPECT_EQ(cudaMemcpy(raw.data(), o_at(i), raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      float* dst = a.data() + static_cast<size_t>(i) * (qe + q_heads);
      for (int e = 0; e < qe; ++e) {
        if (o_dtype[i] == 3) {
          std::memcpy(&dst[e], raw.data() + 4 * e, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, raw.data() + 2 * e, 2);
          dst[e] = Bf16ToFloat(h);
        }
      }
      std::memcpy(dst + qe, raw.data() + static_cast<size_t>(qe) * 4, q_heads * 4);
    }
    return a;
  };
  for (int round = 0; round < 10; ++round) {
    if (round == 3) pages[2][0] = (*more)[0];  // a page id changed in place
    if (round == 5) {
      // Another launch's 4 new windows take 4 of the 5 slots.
      std::vector<float> other_out(static_cast<size_t>(4) * (qe + q_heads));
      std::vector<AttendJob> others(4);
      for (int i = 0; i < 4; ++i) {
        AttendJob& j = others[i];
        j.pages = sp.pages;
        j.window = Bf16Tokens{hk[kItems + i].data(), hv[kItems + i].data(), 90};
        j.window_id = 900 + i;
        j.q_heads = q_heads;
        j.softmax_scale = 1.0f / std::sqrt(128.0f);
        j.query = q.data();
        j.out = other_out.data() + static_cast<size_t>(i) * (qe + q_heads);
        j.lse = j.out + qe;
      }
      sp.cuda->Attend(absl::MakeSpan(others));
      for (const AttendJob& j : others) ASSERT_TRUE(j.status.ok()) << j.status;
    }
    if (round == 7) ++wtok[3];  // a window grown
    for (int i = 0; i < kItems; ++i) {
      for (int e = 0; e < qe; ++e) {
        float x = g(rng);
        if (q_dtype[i] == 1) x = Bf16ToFloat(FloatToBf16(x));  // what the wire carries
        q[static_cast<size_t>(i) * qe + e] = x;
      }
    }
    const int bad_item = round == 4 || round == 8 ? 1 : -1;  // rounds 4 and 8 reuse a plan
    if (bad_item >= 0) q[static_cast<size_t>(bad_item) * qe + 77] = NAN;
    for (int i = 0; i < kItems; ++i) {
      if (q_dtype[i] == 0) continue;
      std::vector<uint8_t> wire(static_cast<size_t>(qe) * (q_dtype[i] == 3 ? 4 : 2));
      for (int e = 0; e < qe; ++e) {
        const float x = q[static_cast<size_t>(i) * qe + e];
        if (q_dtype[i] == 3) {
          std::memcpy(wire.data() + 4 * e, &x, 4);
        } else {
          const uint16_t h = FloatToBf16(x);
          std::memcpy(wire.data() + 2 * e, &h, 2);
        }
      }
      ASSERT_EQ(cudaMemcpy(q_at(i), wire.data(), wire.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    std::vector<std::vector<float>> got;
    for (int twice = 0; twice < 2; ++twice) {
      std::vector<float> out(static_cast<size_t>(kItems) * (qe + q_heads), NAN);
      std::vector<AttendJob> js = jobs(&out, false);
      sp.cuda->Attend(absl::MakeSpan(js));
      for (int i = 0; i < kItems; ++i) {
        ASSERT_TRUE(js[i].status.ok()) << "round " << round << ": " << js[i].status;
        if (q_dtype[i] == 0) continue;  // host queries are the handler's to check
        EXPECT_EQ(js[i].query_bad, i == bad_item ? 77 : -1) << "round " << round << " item " << i;
      }
      got.push_back(answers(out));
    }
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0) << "round " << round;
    if (bad_item >= 0) continue;
    std::vector<float> ref(got[0].size(), NAN);
    std::vector<AttendJob> jc = jobs(&ref, true);
    sp.cpu->Attend(absl::MakeSpan(jc));
    for (int i = 0; i < kItems; ++i) {
      ASSERT_TRUE(jc[i].status.ok()) << jc[i].status;
      const double bound = o_dtype[i] == 1 ? 1e-2 : 1e-4;  // bf16 outputs carry 8 bits
      double diff = 0, norm = 0;
      for (int e = 0; e < qe; ++e) {
        const size_t at = static_cast<size_t>(i) * (qe + q_heads) + e;
        ASSERT_TRUE(std::isfinite(got[0][at])) << "round " << round << " item " << i;
        diff = std::max(diff, static_cast<double>(std::fabs(got[0][at] - ref[at])));
        norm = std::max(norm, static_cast<double>(std::fabs(ref[at])));
      }
      EXPECT_LE(diff, bound * norm) << "round " << round << " item " << i;
      for (int h = 0; h < q_heads; ++h) {
        const size_t at = static_cast<size_t>(i) * (qe + q_heads) + qe + h;
        EXPECT_NEAR(got[0][at], ref[at], 1e-4 * (1 + std::fabs(ref[at]))) << "round " << round << " item " << i;
      }
    }
  }
  cudaFree(q_dev);
  cudaFree(o_dev);
}

}  // namespace
}  // namespace driftkv
