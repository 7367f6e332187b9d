// The service end to end on the GPU: two in-process servers, one on the CPU
// backend and one on the CUDA backend (same config), receive the same
// prefill and the same decode steps from several concurrent clients (so the
// CUDA server merges Attend calls into shared launches). Every Attend output
// must agree to 1e-4 and every Read must be bit-identical (the GPU encoder
// writes the CPU's records), with the Hadamard rotation and with a WUSH
// transforms file.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "codec/half.h"
#include "codec/transforms_file.h"
#include "codec/wush.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "service/server.h"
#include "service/tensor.h"

namespace driftkv {
namespace {

constexpr int kLayers = 2, kKvHeads = 4, kD = 128, kN = kKvHeads * kD, kQHeads = 8;
constexpr int kSeqs = 6, kPrefill = 300, kSteps = 12;

std::vector<float> Bf16Gaussian(size_t count, float offset_scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> offset(kN);
  for (float& o : offset) o = offset_scale * g(rng);
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = Bf16ToFloat(FloatToBf16(offset[i % kN] + g(rng)));
  return x;
}

std::string WriteRandomTransforms() {
  TransformSet set;
  set.layers = kLayers;
  set.kv_heads = kKvHeads;
  set.head_dim = kD;
  set.gamma = kWushDefaultGamma;
  set.calibration_tokens = 1;
  set.Resize();
  std::mt19937_64 rng(17);
  std::normal_distribution<double> g(0.0, 1.0);
  auto spd = [&] {
    std::vector<double> a(kD * kD), m(kD * kD, 0.0);
    for (double& x : a) x = g(rng);
    for (int i = 0; i < kD; ++i) {
      for (int j = 0; j < kD; ++j) {
        for (int k = 0; k < kD; ++k) m[i * kD + j] += a[i * kD + k] * a[j * kD + k] / kD;
      }
      m[i * kD + i] += 0.1;
    }
    return m;
  };
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (int kind = 0; kind < 2; ++kind) {
        absl::StatusOr<WushTransform> t = BuildWushTransform(spd(), spd(), kD);
        EXPECT_TRUE(t.ok()) << t.status();
        float* fwd = set.matrix(l, h, kind == 0 ? Mat::kKey : Mat::kValue);
        float* inv = set.matrix(l, h, kind == 0 ? Mat::kKeyInverse : Mat::kValueInverse);
        for (int i = 0; i < kD * kD; ++i) fwd[i] = static_cast<float>(t->t[i]), inv[i] = static_cast<float>(t->inv[i]);
      }
    }
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "/service_gpu_test.xfm");
  EXPECT_TRUE(WriteTransformsFile(path, set).ok());
  return path;
}

ServiceOptions Options(const std::string& backend, const std::string& transforms_file) {
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.backend = backend;
  o.layers = kLayers;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.pool_bytes = 64ull << 20;
  if (!transforms_file.empty()) {
    o.transform = TransformKind::kWush;
    o.transforms_file = transforms_file;
    absl::StatusOr<TransformSet> set = ReadTransformsFile(transforms_file);
    EXPECT_TRUE(set.ok()) << set.status();
    o.transforms = std::make_shared<const TransformSet>(*std::move(set));
    o.codec.hadamard = false;
  }
  return o;
}

void RunBoth(const std::string& transforms_file) {
  auto cpu = DriftkvServer::Start(Options("cpu", transforms_file));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto cuda = DriftkvServer::Start(Options("cuda", transforms_file));
  ASSERT_TRUE(cuda.ok()) << cuda.status();

  std::vector<std::vector<float>> keys(kSeqs * kLayers), values(kSeqs * kLayers);
  for (int i = 0; i < kSeqs * kLayers; ++i) {
    keys[i] = Bf16Gaussian(static_cast<size_t>(kPrefill + kSteps) * kN, 2.0f, 100 + i);
    values[i] = Bf16Gaussian(static_cast<size_t>(kPrefill + kSteps) * kN, 0.0f, 200 + i);
  }
  // Each sequence's client thread pushes its prefill, then runs its decode
  // steps on both servers; the threads run concurrently.
  std::vector<double> diff(kSeqs, 0.0), norm(kSeqs, 0.0);
  std::vector<int> failures(kSeqs, 0);
  std::vector<std::thread> threads;
  for (int s = 0; s < kSeqs; ++s) {
    threads.emplace_back([&, s] {
      ClientOptions co_cpu, co_gpu;
      co_cpu.target = absl::StrCat("127.0.0.1:", (*cpu)->port());
      co_gpu.target = absl::StrCat("127.0.0.1:", (*cuda)->port());
      Client c_cpu(co_cpu), c_gpu(co_gpu);
      const std::string seq = absl::StrCat("s", s);
      std::vector<v1::AppendChunk> chunks;
      for (int l = 0; l < kLayers; ++l) {
        const std::vector<float>& k = keys[s * kLayers + l];
        const std::vector<float>& v = values[s * kLayers + l];
        for (int t = 0; t < kPrefill; t += 100) {
          chunks.push_back(MakeChunk(seq, l, t, 100, k.data() + t * kN, v.data() + t * kN, kN, v1::DTYPE_BF16));
        }
      }
      if (!c_cpu.Append(chunks).ok() || !c_gpu.Append(chunks).ok()) {
        ++failures[s];
        return;
      }
      std::mt19937_64 rng(900 + s);
      std::normal_distribution<float> g(0.0f, 1.0f);
      for (int step = 0; step < kSteps; ++step) {
        const int pos = kPrefill + step;
        v1::AttendRequest req;
        for (int l = 0; l < kLayers; ++l) {
          std::vector<float> q(kQHeads * kD);
          for (float& x : q) x = g(rng);
          v1::AttendItem* it = req.add_items();
          it->set_sequence_id(seq);
          it->set_layer(l);
          it->set_dtype(v1::DTYPE_F32);
          it->set_q_heads(kQHeads);
          FloatToTensor(q.data(), q.size(), v1::DTYPE_F32, it->mutable_query());
          FloatToTensor(keys[s * kLayers + l].data() + pos * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
          FloatToTensor(values[s * kLayers + l].data() + pos * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
          it->set_new_token_index(pos);
        }
        absl::StatusOr<v1::AttendResponse> a = c_cpu.Attend(req), b = c_gpu.Attend(req);
        if (!a.ok() || !b.ok()) {
          ++failures[s];
          return;
        }
        for (int l = 0; l < kLayers; ++l) {
          const std::vector<float> x = OutputFloats(a->results(l)), y = OutputFloats(b->results(l));
          for (size_t i = 0; i < x.size(); ++i) {
            diff[s] += (x[i] - y[i]) * (x[i] - y[i]);
            norm[s] += x[i] * x[i];
          }
          for (int h = 0; h < kQHeads; ++h) {
            if (std::fabs(a->results(l).lse(h) - b->results(l).lse(h)) > 1e-4 * (1 + std::fabs(a->results(l).lse(h)))) {
              ++failures[s];
            }
          }
        }
      }
      // Read: the GPU wrote the same records the CPU did.
      for (int l = 0; l < kLayers; ++l) {
        absl::StatusOr<Client::Tensors> x = c_cpu.ReadFloat(seq, l, 0, 0), y = c_gpu.ReadFloat(seq, l, 0, 0);
        if (!x.ok() || !y.ok() || x->keys != y->keys || x->values != y->values) ++failures[s];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < kSeqs; ++s) {
    EXPECT_EQ(failures[s], 0) << "sequence " << s;
    EXPECT_LT(std::sqrt(diff[s] / norm[s]), 1e-4) << "sequence " << s;
  }
  std::printf("%s: cuda vs cpu relative L2 difference, sequence 0: %.3g\n",
              transforms_file.empty() ? "hadamard" : "wush", std::sqrt(diff[0] / norm[0]));
}

TEST(ServiceGpu, CudaServerMatchesCpuServer) {
  if (!gpu::GpuAvailable()) {
    std::printf("skipped: no GPU\n");
    GTEST_SKIP() << "skipped: no GPU";
  }
  RunBoth("");
}

TEST(ServiceGpu, CudaServerMatchesCpuServerWithWush) {
  if (!gpu::GpuAvailable()) {
    std::printf("skipped: no GPU\n");
    GTEST_SKIP() << "skipped: no GPU";
  }
  RunBoth(WriteRandomTransforms());
}

}  // namespace
}  // namespace driftkv
