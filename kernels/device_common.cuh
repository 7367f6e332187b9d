// Device helpers shared by the attention and encode kernels: tensor-core
// fragments (mma.sync m16n8k16, fp16 in, fp32 accumulate), ldmatrix, warp
// reductions, fp16/bf16 bit conversions matching wire/half.h, and the
// split-KV partial state with its merge kernel.
#ifndef DRIFTKV_KERNELS_DEVICE_COMMON_CUH_
#define DRIFTKV_KERNELS_DEVICE_COMMON_CUH_

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/attention_batch.h"
#include "kernels/query_scale.h"

namespace driftkv {
namespace gpu {

constexpr float kNegInf = -__builtin_huge_valf();

// A = 16x16 fp16 row-major fragment (4 regs), B = 16x8 fp16 col-major (2
// regs), C/D = 16x8 fp32 (4 regs). Lane l holds, with g = l/4, t = l%4:
//   a0 = A[g][2t..2t+1]  a1 = A[g+8][2t..]  a2 = A[g][2t+8..]  a3 = A[g+8][2t+8..]
//   b0 = B[2t..2t+1][g]  b1 = B[2t+8..2t+9][g]
//   d0,d1 = D[g][2t..2t+1]  d2,d3 = D[g+8][2t..2t+1]
// The lower 16 bits of a register hold the element with the lower k index.
__device__ __forceinline__ void Mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with a zero accumulator in (the tensor core reads zeros
// instead of four registers that would have to be zeroed first).
__device__ __forceinline__ void Mma16816Zero(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {0f00000000,0f00000000,0f00000000,0f00000000};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Loads an A fragment from a row-major fp16 tile in shared memory. Lane l
// passes the address of row (l & 7) + 8 * ((l >> 3) & 1), column 8 * (l >> 4)
// of the 16x16 tile (16-byte aligned).
__device__ __forceinline__ void LdMatrixX4(uint32_t a[4], const void* smem_row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// Programmatic dependent launch (LaunchDependentKernel in launch.cuh):
// this block lets the kernel launched after it on the stream start its
// blocks; no-ops when there is none.
__device__ __forceinline__ void LaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the kernels this one depends on have completed and their
// writes are visible; returns at once in a kernel launched the usual way.
__device__ __forceinline__ void WaitPrerequisites() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float Bf16ToFloatDev(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// wire/half.h FloatToBf16, bit for bit: round to nearest even, NaN kept
// quiet.
__device__ __forceinline__ uint16_t FloatToBf16Dev(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// The WUSH transform matrices (kernels/transform.h, "DEVICE FORM").
__device__ __forceinline__ const float* TransformMatrixAt(const float* mats, int layer, int kv_head, int m,
                                                          int kv_heads, int d) {
  return mats + ((static_cast<size_t>(layer) * kv_heads + kv_head) * 4 + m) * d * d;
}

// Channel i of A x for a vector x in shared memory: sum_j A[j][i] x[j] in j
// order with separate multiply and add, as codec/transform/transform.cc's MatVec
// (bit-identical results; the reads A[j][i] are coalesced across i).
__device__ __forceinline__ float TransformedChannel(const float* a, const float* x, int i, int d) {
  float acc = 0.0f;
  for (int j = 0; j < d; ++j) acc = __fadd_rn(acc, __fmul_rn(a[static_cast<size_t>(j) * d + i], x[j]));
  return acc;
}

// Barriers for HadamardRows: the threads of a block, or of a warp.
struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};
struct WarpSync {
  __device__ void operator()() const { __syncwarp(); }
};

// THE device Hadamard: the normalised Walsh-Hadamard transform of
// codec/hadamard.h in place on `rows` consecutive rows of d floats at x
// (shared memory; d a power of two), by `threads` cooperating threads of
// which this one is `tid`, with `sync` their barrier; every one of them
// must call it. The butterflies (a + b, a - b) run stage by stage in the
// order of codec/hadamard.cc and the scale is 1/sqrt(d) rounded from
// double, as on the CPU, so the results are bit-identical to HadamardHeads.
// Syncs before the first stage and after the scaling.
template <typename Sync>
__device__ __forceinline__ void HadamardRows(float* x, int rows, int d, int tid, int threads, Sync sync) {
  sync();
  const int pairs = rows * d / 2, half = d / 2;
  for (int len = 1; len < d; len <<= 1) {
    for (int p = tid; p < pairs; p += threads) {
      const int h = p / half, r = p % half;
      const int j = h * d + (r / len) * 2 * len + (r % len);
      const float a = x[j], b = x[j + len];
      x[j] = a + b;
      x[j + len] = a - b;
    }
    sync();
  }
  const float norm = static_cast<float>(1.0 / sqrt(static_cast<double>(d)));
  for (int i = tid; i < rows * d; i += threads) x[i] *= norm;
  sync();
}

// fp16 hi/lo split of a float: hi = fp16(v), lo = fp16(v - hi); hi + lo
// carries about 22 significant bits, so a tensor-core product against exact
// small integers (the decoded levels) is accurate to fp32 level.
__device__ __forceinline__ void SplitHalf(float v, uint16_t* hi, uint16_t* lo) {
  const __half h = __float2half_rn(v);
  *hi = __half_as_ushort(h);
  *lo = __half_as_ushort(__float2half_rn(v - __half2float(h)));
}

// Partial split-KV state of one (item, query head), in the workspace:
// m = running max of the scaled scores, l = sum exp(score - m), acc[d] =
// sum exp(score - m) v[d]. The empty state is (m = -inf, l = 0, acc = 0):
// merging it changes nothing.
struct PartialLayout {
  int items, splits, q_heads, head_dim;
  __host__ __device__ size_t ml_index(int item, int split, int h) const {
    return (static_cast<size_t>(item) * splits + split) * q_heads + h;
  }
  __host__ __device__ size_t acc_index(int item, int split, int h) const { return ml_index(item, split, h) * head_dim; }
  __host__ __device__ size_t count() const { return static_cast<size_t>(items) * splits * q_heads; }
};

struct MergeParams {
  PartialLayout part;
  const float* m_dev;
  const float* l_dev;
  const float* acc_dev;
  bool rotated;  // acc is in the Hadamard domain: rotate back after merging
  // Or, when not null, acc is T_V v domain: map back with matrix 3 of
  // (layer_dev[item], kv head) of these transforms (kernels/transform.h).
  const float* out_transform_dev = nullptr;
  const int32_t* layer_dev = nullptr;
  int kv_heads;
  const uint16_t* window_k_dev;  // optional bf16 window (D-Quant)
  const uint16_t* window_v_dev;
  const int32_t* window_tokens_dev;
  const int32_t* window_start_dev = nullptr;  // see AttentionBatch
  const float* query_dev;
  float softmax_scale;
  float* out_dev;
  float* lse_dev;
  const OutputTarget* targets_dev = nullptr;  // see AttentionBatch::out_targets_dev
  bool per_head = false;                      // one block per query head even where a group's block applies
};

// Splits of the workspace into (m, l, acc) arrays.
struct Workspace {
  float* m;
  float* l;
  float* acc;
};
Workspace CarveWorkspace(void* ws, const PartialLayout& part);

absl::Status LaunchMerge(const MergeParams& p, cudaStream_t stream);

absl::Status CudaStatus(cudaError_t e, const char* what);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_DEVICE_COMMON_CUH_
