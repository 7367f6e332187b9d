// GPU D-Quant encode: see encode.h. Mirrors codec/dquant_codec.cc,
// codec/stream_codec.cc and codec/drift.cc step by step; where a sum is a
// warp reduction instead of a sequential loop, results can differ from the
// CPU encoder in the last bits (never in validity: the container is checked
// with the real rANS length).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/final_grid.h"
#include "codec/format_constants.h"
#include "kernels/device_common.cuh"
#include "kernels/encode.h"
#include "kernels/launch.cuh"
#include "wire/half.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kEncThreads = 128;
constexpr int kEncWarps = kEncThreads / 32;
constexpr int kMaxN = 1024;
constexpr int kMeanThreads = 256;
// The search and format constants (kDriftBisectionSteps,
// kDriftBracketOctaves, kMaxRetries, kStateLow, kMaxLevels) come from
// codec/format_constants.h and kHalfMax from wire/half.h, the CPU codec's
// own definitions.

__device__ __forceinline__ float RoundToHalfDev(float f) {
  return __half2float(__float2half_rn(f));
}

__device__ double WarpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ double WarpMaxD(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ double WarpMinD(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmin(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The step function u -> level of one lambda (codec/drift.h Assignment),
// plus the cost of each interval, in shared memory.
struct Asg {
  int count;
  int level[kMaxLevels];
  float breaks[kMaxLevels - 1];
  float icost[kMaxLevels];
};

// codec/drift.cc BuildAssignment, run by one lane.
__device__ void BuildAssignmentDev(const float* cost, int levels, double lambda, Asg* a) {
  double start[kMaxLevels], intercept[kMaxLevels];
  int count = 0;
  for (int m = 0; m < levels; ++m) {
    if (isinf(cost[m])) continue;
    // No fused multiply-add: the CPU rounds lambda * cost before the sum.
    const double b = __dadd_rn(static_cast<double>(m) * m, __dmul_rn(lambda, cost[m]));
    double x = -HUGE_VAL;
    while (count > 0) {
      const int top = a->level[count - 1];
      x = (b - intercept[count - 1]) / (2.0 * (m - top));
      if (count >= 2 && x <= start[count - 1]) {
        --count;
        continue;
      }
      break;
    }
    a->level[count] = m;
    intercept[count] = b;
    start[count] = x;
    ++count;
  }
  a->count = count;
  for (int j = 1; j < count; ++j) a->breaks[j - 1] = static_cast<float>(start[j]);
  for (int j = 0; j < count; ++j) a->icost[j] = cost[a->level[j]];
}

__device__ void Build(const float* cost, int levels, double lambda, Asg* a, int lane) {
  if (lane == 0) BuildAssignmentDev(cost, levels, lambda, a);
  __syncwarp();
}

// Sum of ideal costs of assignment `a` over u[0..n); writes symbols if asked.
__device__ double AssignCost(const float* u, int n, const Asg* a, uint8_t* sym, int lane) {
  float brk[kMaxLevels - 1];
  const int nb = a->count - 1;
#pragma unroll
  for (int b = 0; b < kMaxLevels - 1; ++b) brk[b] = b < nb ? a->breaks[b] : HUGE_VALF;
  // Summed in double, where a sum of up to 1024 float costs (below 2^5,
  // 24-bit mantissas) is exact in any order: the total equals the CPU's
  // (codec/drift.cc AssignmentCost, exact too), so budget comparisons at a
  // near-tie go the same way on both. A float sum here made about one
  // stream in a thousand drift differently (measured in service_gpu_test).
  double c = 0.0;
  for (int i = lane; i < n; i += 32) {
    const float v = u[i];
    int j = 0;
#pragma unroll
    for (int b = 0; b < kMaxLevels - 1; ++b) j += v > brk[b];
    c += static_cast<double>(a->icost[j]);
    if (sym != nullptr) sym[i] = static_cast<uint8_t>(a->level[j]);
  }
  __syncwarp();
  return WarpSumD(c);
}

__device__ int NearestLevelDev(float u, int levels) {
  if (!(u > 0.5f)) return 0;
  if (u >= static_cast<float>(levels - 1)) return levels - 1;
  return static_cast<int>(ceilf(u - 0.5f));
}

// codec/drift.cc Drift, one warp; returns the assignment's ideal cost.
__device__ double DriftDev(const float* u, int n, const EncodeAlphabet& al, double budget, uint8_t* sym, Asg* a,
                           int lane) {
  Build(al.cost_bits, al.levels, 0.0, a, lane);
  const double nearest_cost = AssignCost(u, n, a, nullptr, lane);
  if (nearest_cost <= budget) return AssignCost(u, n, a, sym, lane);
  double max_d = 0.0, min_d = HUGE_VAL;
  for (int i = lane; i < n; i += 32) {
    const double lo = u[i], hi = u[i] - (al.levels - 1);
    max_d = fmax(max_d, fmax(lo * lo, hi * hi));
    const double r = u[i] - NearestLevelDev(u[i], al.levels);
    min_d = fmin(min_d, r * r);
  }
  max_d = WarpMaxD(max_d);
  min_d = WarpMinD(min_d);
  double hi = log2(8.0 * fmax(max_d - min_d, 1e-30));
  double lo = hi - kDriftBracketOctaves;
  Build(al.cost_bits, al.levels, exp2(hi), a, lane);
  double top_cost = AssignCost(u, n, a, nullptr, lane);
  for (int widen = 0; top_cost > budget && widen < 16; ++widen) {
    lo = hi;
    hi += 8.0;
    Build(al.cost_bits, al.levels, exp2(hi), a, lane);
    top_cost = AssignCost(u, n, a, nullptr, lane);
  }
  if (top_cost > budget) {
    float masked[kMaxLevels];
    float min_cost = al.cost_bits[0];
    for (int m = 1; m < al.levels; ++m) min_cost = fminf(min_cost, al.cost_bits[m]);
    for (int m = 0; m < al.levels; ++m) masked[m] = al.cost_bits[m] == min_cost ? 0.0f : HUGE_VALF;
    if (lane == 0) BuildAssignmentDev(masked, al.levels, 1.0, a);
    __syncwarp();
    // icost must be the real costs for the returned total.
    if (lane == 0)
      for (int j = 0; j < a->count; ++j) a->icost[j] = al.cost_bits[a->level[j]];
    __syncwarp();
    return AssignCost(u, n, a, sym, lane);
  }
  for (int step = 0; step < kDriftBisectionSteps; ++step) {
    const double mu = 0.5 * (lo + hi);
    Build(al.cost_bits, al.levels, exp2(mu), a, lane);
    const double c = AssignCost(u, n, a, nullptr, lane);
    if (c <= budget)
      hi = mu;
    else
      lo = mu;
  }
  Build(al.cost_bits, al.levels, exp2(hi), a, lane);
  return AssignCost(u, n, a, sym, lane);
}

// codec/rans.cc RansEncode by lane 0 into scratch[0, n + 4); returns the
// bytes used (broadcast), which end at scratch + n + 4.
__device__ int RansEncodeLane0(const uint8_t* sym, int n, const EncodeAlphabet& al, uint8_t* scratch, int lane) {
  int used = 0;
  if (lane == 0) {
    uint8_t* const end = scratch + n + 4;
    uint8_t* ptr = end;
    uint32_t x = kStateLow;
    for (int i = n - 1; i >= 0; --i) {
      const uint32_t f = al.freq[sym[i]];
      if (x >= kStateLow * f) {
        *--ptr = static_cast<uint8_t>(x & 0xff);
        x >>= 8;
      }
      x = ((x / f) << 8) + (x % f) + al.cum[sym[i]];
    }
    ptr -= 4;
    ptr[0] = static_cast<uint8_t>(x);
    ptr[1] = static_cast<uint8_t>(x >> 8);
    ptr[2] = static_cast<uint8_t>(x >> 16);
    ptr[3] = static_cast<uint8_t>(x >> 24);
    used = static_cast<int>(end - ptr);
  }
  used = __shfl_sync(0xffffffffu, used, 0);
  __syncwarp();
  return used;
}

struct WarpSmem {
  float x[kMaxN];
  float u[kMaxN];
  uint8_t sym[kMaxN];
  uint8_t scratch[kMaxN + 4];
  Asg asg;
};

__global__ void __launch_bounds__(kEncThreads) EncodeKernel(EncodeParams p) {
  __shared__ WarpSmem smem_all[kEncWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int stream = blockIdx.x * kEncWarps + warp;
  if (stream >= 2 * p.tokens) return;
  WarpSmem& s = smem_all[warp];
  const PageLayout& lay = p.layout;
  const int n = lay.kv_heads * lay.head_dim, d = lay.head_dim;
  const int t = stream >> 1;
  const bool is_key = (stream & 1) == 0;
  const EncodeAlphabet& al = is_key ? p.keys : p.values;
  uint8_t* page = p.pool_dev + static_cast<size_t>(p.pages_dev[t / kPageTokens]) * lay.page_bytes;
  const int slot = t % kPageTokens;
  uint8_t* record = is_key ? page + static_cast<size_t>(slot) * lay.key_stride
                           : page + lay.value_offset + static_cast<size_t>(slot) * lay.value_stride;
  const float* src = (is_key ? p.keys_dev : p.values_dev) + static_cast<size_t>(t) * n;

  for (int i = lane; i < n; i += 32) s.x[i] = src[i];
  __syncwarp();
  if (p.rotate) HadamardRows(s.x, n / d, d, lane, 32, WarpSync());
  if (is_key) {
    const uint8_t* mean = page + lay.mean_offset;
    const float mscale = *reinterpret_cast<const float*>(mean);
    const int8_t* q = reinterpret_cast<const int8_t*>(mean + 4);
    // mu = q * scale rounded, then x - mu rounded, as the CPU (codec/
    // dquant_codec.cc LoadMean): a fused multiply-add here, which nvcc
    // emits by default, rounds once and made rare streams differ.
    for (int i = lane; i < n; i += 32) s.x[i] = __fsub_rn(s.x[i], __fmul_rn(static_cast<float>(q[i]), mscale));
    __syncwarp();
  }
  float lo = HUGE_VALF, hi = -HUGE_VALF;
  bool bad = false;
  for (int i = lane; i < n; i += 32) {
    const float v = s.x[i];
    bad |= !isfinite(v) || fabsf(v) > kHalfMax;
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  lo = -WarpMax(-lo);
  hi = WarpMax(hi);
  bad = __any_sync(0xffffffffu, bad);
  EncodeStreamStats st{0, 0, 0, static_cast<int8_t>(bad ? 1 : 0), 0, 0, 0};
  const int levels = al.levels, C = al.payload_bytes;
  float scale = 0.0f, offset = RoundToHalfDev(lo);
  if (!bad && hi > lo) {
    const float s0 = static_cast<float>((static_cast<double>(hi) - lo) / (levels - 1));
    for (int i = lane; i < n; i += 32) s.u[i] = (s.x[i] - lo) / s0;
    __syncwarp();
    DriftDev(s.u, n, al, 8.0 * C - 32, s.sym, &s.asg, lane);
    double sm = 0, smm = 0, sx = 0, sxm = 0;
    for (int i = lane; i < n; i += 32) {
      const double m = s.sym[i], x = s.x[i];
      sm += m;
      smm += m * m;
      sx += x;
      sxm += x * m;
    }
    sm = WarpSumD(sm);
    smm = WarpSumD(smm);
    sx = WarpSumD(sx);
    sxm = WarpSumD(sxm);
    const double det = n * smm - sm * sm;
    double sc = s0, o = lo;
    if (det > 0.0) {
      sc = (n * sxm - sm * sx) / det;
      o = (sx - sc * sm) / n;
    }
    if (isfinite(o) && fabs(o) > kHalfMax && smm > 0.0) {
      // As StreamCodec::Encode: the fit wants an origin fp16 cannot hold (a
      // lone outlier drifted towards the centre): pin o, refit s alone.
      o = fmin(fmax(o, -static_cast<double>(kHalfMax)), static_cast<double>(kHalfMax));
      sc = (sxm - o * sm) / smm;
    }
    if (!(sc > 0.0) || !isfinite(sc) || !isfinite(o)) {
      sc = s0;
      o = lo;
    }
    scale = RoundToHalfDev(static_cast<float>(fmin(sc, static_cast<double>(kHalfMax))));
    offset = RoundToHalfDev(
        static_cast<float>(fmax(fmin(o, static_cast<double>(kHalfMax)), -static_cast<double>(kHalfMax))));
  }
  int used = 0;
  bool done = false;
  if (!bad && scale > 0.0f) {
    for (int i = lane; i < n; i += 32) s.u[i] = (s.x[i] - offset) / scale;
    __syncwarp();
    double budget = 8.0 * C - 32;
    for (int attempt = 0; attempt < kMaxRetries && !done; ++attempt) {
      const double cost = DriftDev(s.u, n, al, budget, s.sym, &s.asg, lane);
      used = RansEncodeLane0(s.sym, n, al, s.scratch, lane);
      if (used <= C) {
        done = true;
      } else {
        ++st.retries;
        const double excess = 8.0 * (used - C);
        budget = fmin(budget - 1.0, cost - excess - static_cast<double>(1 << attempt));
      }
    }
    if (!done) {
      st.fallback = 1;
      float masked[kMaxLevels];
      float min_cost = al.cost_bits[0];
      for (int m = 1; m < levels; ++m) min_cost = fminf(min_cost, al.cost_bits[m]);
      for (int m = 0; m < levels; ++m) masked[m] = al.cost_bits[m] == min_cost ? 0.0f : HUGE_VALF;
      if (lane == 0) BuildAssignmentDev(masked, levels, 1.0, &s.asg);
      __syncwarp();
      AssignCost(s.u, n, &s.asg, s.sym, lane);
      used = RansEncodeLane0(s.sym, n, al, s.scratch, lane);
      done = used <= C;
    }
  } else {
    scale = 0.0f;
  }
  if (!done) {
    if (scale > 0.0f) st.fallback = 2;
    for (int i = lane; i < n; i += 32) s.sym[i] = static_cast<uint8_t>(al.cheapest);
    __syncwarp();
    used = RansEncodeLane0(s.sym, n, al, s.scratch, lane);
  }
  st.bytes_used = used;
  if (scale > 0.0f) {
    // Drift statistics on the final symbols, as StreamCodec::Encode counts them.
    int moved = 0, max_move = 0;
    for (int i = lane; i < n; i += 32) {
      const float u = s.u[i];
      const int nearest =
          !(u > 0.5f) ? 0 : (u >= static_cast<float>(levels - 1) ? levels - 1 : static_cast<int>(ceilf(u - 0.5f)));
      const int d = abs(static_cast<int>(s.sym[i]) - nearest);
      moved += d != 0;
      max_move = max(max_move, d);
    }
    st.moved = static_cast<int16_t>(__reduce_add_sync(0xffffffffu, moved));
    st.max_move = static_cast<int8_t>(__reduce_max_sync(0xffffffffu, max_move));
    if (al.refit != kRefitLeastSquares) {
      // StreamCodec::Encode step 6 (RefitToSymbols): the same sums, and the
      // same decision in FinalGrid; the butterfly leaves every lane the same sums.
      double sm = 0, smm = 0, sx = 0, sxx = 0, sxm = 0;
      for (int i = lane; i < n; i += 32) {
        const double m = s.sym[i], x = s.x[i];
        sm += m;
        smm += MulRn(m, m);
        sx += x;
        sxx += MulRn(x, x);
        sxm += MulRn(x, m);
      }
      sm = WarpSumD(sm);
      smm = WarpSumD(smm);
      sx = WarpSumD(sx);
      sxx = WarpSumD(sxx);
      sxm = WarpSumD(sxm);
      double fs, fo;
      if (FinalGrid(al.refit, n, sm, smm, sx, sxx, sxm, &fs, &fo)) {
        const float hs = RoundToHalfDev(static_cast<float>(fs));
        if (hs > 0.0f) {
          scale = hs;
          offset = RoundToHalfDev(static_cast<float>(fo));
        }
      }
    }
  } else if (!bad) {
    st.constant = 1;
  }
  // Record: header, payload (used bytes, then zeros), zero padding.
  const int stride = is_key ? lay.key_stride : lay.value_stride;
  const uint8_t* bytes = s.scratch + n + 4 - used;
  for (int i = lane; i < stride; i += 32) {
    uint8_t v = 0;
    if (i == 0)
      v = __half_as_ushort(__float2half_rn(scale)) & 0xff;
    else if (i == 1)
      v = __half_as_ushort(__float2half_rn(scale)) >> 8;
    else if (i == 2)
      v = __half_as_ushort(__float2half_rn(offset)) & 0xff;
    else if (i == 3)
      v = __half_as_ushort(__float2half_rn(offset)) >> 8;
    else if (i - 4 < used && i - 4 < C)
      v = bytes[i - 4];
    record[i] = v;
  }
  if (p.stats_dev != nullptr && lane == 0) p.stats_dev[stream] = st;
}

// One block per window: the rotated keys' channel mean as an INT8 record
// (codec/dquant_codec.cc EncodeWindow, same double sums in token order).
__global__ void __launch_bounds__(kMeanThreads) MeanKernel(EncodeParams p) {
  __shared__ float row[kMaxN];
  __shared__ double red[kMeanThreads / 32];
  const PageLayout& lay = p.layout;
  const int n = lay.kv_heads * lay.head_dim, d = lay.head_dim, w = blockIdx.x, tid = threadIdx.x;
  const int first = w * kPageTokens, count = min(kPageTokens, p.tokens - first);
  constexpr int kPer = kMaxN / kMeanThreads;
  double sum[kPer] = {};
  for (int t = 0; t < count; ++t) {
    for (int i = tid; i < n; i += kMeanThreads) row[i] = p.keys_dev[static_cast<size_t>(first + t) * n + i];
    if (p.rotate) {
      HadamardRows(row, n / d, d, tid, kMeanThreads, BlockSync());
    } else {
      __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = tid + k * kMeanThreads;
      if (i < n) sum[k] += static_cast<double>(row[i]);
    }
    __syncthreads();
  }
  double max_abs = 0.0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    sum[k] /= count;
    if (tid + k * kMeanThreads < n) max_abs = fmax(max_abs, fabs(sum[k]));
  }
  max_abs = WarpMaxD(max_abs);
  if ((tid & 31) == 0) red[tid >> 5] = max_abs;
  __syncthreads();
  max_abs = 0.0;
  for (int i = 0; i < kMeanThreads / 32; ++i) max_abs = fmax(max_abs, red[i]);
  const float scale = static_cast<float>(max_abs / 127.0);
  uint8_t* mean = p.pool_dev + static_cast<size_t>(p.pages_dev[w]) * lay.page_bytes + lay.mean_offset;
  if (tid == 0) *reinterpret_cast<float*>(mean) = scale;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = tid + k * kMeanThreads;
    if (i < n) {
      const long long r = scale > 0.0f ? llround(sum[k] / scale) : 0;
      mean[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(r < -127 ? -127 : (r > 127 ? 127 : r)));
    }
  }
  for (int i = 4 + n + tid; i < lay.mean_stride; i += kMeanThreads) mean[i] = 0;
}

__global__ void DecodeRecordsKernel(DecodeRecordsParams p) {
  const int stream = blockIdx.x * blockDim.x + threadIdx.x;
  if (stream >= 2 * p.tokens) return;
  const PageLayout& lay = p.layout;
  const int n = lay.kv_heads * lay.head_dim, t = stream >> 1;
  const bool is_key = (stream & 1) == 0;
  const uint8_t* page = p.pool_dev + static_cast<size_t>(p.pages_dev[t / kPageTokens]) * lay.page_bytes;
  const int slot = t % kPageTokens;
  const uint8_t* rec = is_key ? page + static_cast<size_t>(slot) * lay.key_stride
                              : page + lay.value_offset + static_cast<size_t>(slot) * lay.value_stride;
  const uint32_t* table = p.tables_dev + (is_key ? 0 : 256);
  const int C = is_key ? p.key_payload : p.value_payload;
  const float s = HalfBitsToFloat(static_cast<uint16_t>(rec[0] | (rec[1] << 8)));
  const float o = HalfBitsToFloat(static_cast<uint16_t>(rec[2] | (rec[3] << 8)));
  const uint8_t* pay = rec + 4;
  uint32_t x = pay[0] | (pay[1] << 8) | (pay[2] << 16) | (static_cast<uint32_t>(pay[3]) << 24);
  bool ok = x >= kStateLow && x < (kStateLow << 8);
  if (!ok) x = kStateLow;
  int ptr = 4;
  const float* mu_scale = reinterpret_cast<const float*>(page + lay.mean_offset);
  const int8_t* q = reinterpret_cast<const int8_t*>(page + lay.mean_offset + 4);
  float* out = p.out_dev + static_cast<size_t>(stream) * n;
  for (int i = 0; i < n; ++i) {
    const uint32_t e = table[x & 255];
    const float m = HalfBitsToFloat(static_cast<uint16_t>(e >> 16));
    x = (e & 255) * (x >> 8) + ((e >> 8) & 255);
    if (x < kStateLow) {
      x = (x << 8) | (ptr < C ? pay[ptr] : 0u);
      ++ptr;
    }
    float v = __fadd_rn(o, __fmul_rn(s, m));
    if (is_key) v = __fadd_rn(v, __fmul_rn(static_cast<float>(q[i]), *mu_scale));
    out[i] = v;
  }
  ok = ok && ptr <= C && x == kStateLow && isfinite(s) && isfinite(o) && s >= 0.0f;
  p.ok_dev[stream] = ok ? 1 : 0;
}

}  // namespace

absl::Status LaunchDecodeRecords(const DecodeRecordsParams& p, cudaStream_t stream) {
  if (p.tokens <= 0) return absl::OkStatus();
  DecodeRecordsKernel<<<(2 * p.tokens + 127) / 128, 128, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "decode-records kernel launch");
}

absl::Status LaunchEncode(const EncodeParams& p, cudaStream_t stream) {
  const int n = p.layout.n();
  if (n < 32 || n > kMaxN || n % 32 != 0 || p.layout.head_dim < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream length ", n, " unsupported by the GPU encoder (32..1024, multiple of 32)"));
  }
  if (const std::string error = GpuPageLayoutError(p.layout, PageUse::kEncode); !error.empty()) {
    return absl::InvalidArgumentError(error);
  }
  if (p.tokens < 0) return absl::InvalidArgumentError(absl::StrCat("tokens ", p.tokens, " < 0"));
  if (p.tokens == 0) return absl::OkStatus();
  const int windows = (p.tokens + kPageTokens - 1) / kPageTokens;
  MeanKernel<<<windows, kMeanThreads, 0, stream>>>(p);
  absl::Status st = CudaStatus(cudaGetLastError(), "mean kernel launch");
  if (!st.ok()) return st;
  const int blocks = (2 * p.tokens + kEncWarps - 1) / kEncWarps;
  EncodeKernel<<<blocks, kEncThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "encode kernel launch");
}

}  // namespace gpu
}  // namespace driftkv
