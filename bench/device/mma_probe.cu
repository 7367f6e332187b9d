// Do the tensor cores keep fp16 subnormal operands exact? (The level
// kernel's keys are fp16 subnormals, kernels/level_attention.cu.) One
// mma.m16n8k16 per case: A row 0 = a0 at k = 0 and a1 at k = 1, B column
// 0 = b0, b1; D[0][0] against the float64 sum of the products. Prints
// each inexact case and the count. Built outside Bazel, with the CUDA
// toolkit alone, and carried to the device in .device/:
//   nvcc -O2 -arch=sm_90a -cudart static -o .device/probe/mma_probe bench/device/mma_probe.cu
#include <cuda_fp16.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
__global__ void K(const uint16_t* a, const uint16_t* b, float* out, int n) {
  int lane = threadIdx.x;
  for (int c = 0; c < n; ++c) {
    // A fragment: lane g = lane/4, t = lane%4: a0 = A[g][2t,2t+1]
    uint32_t A[4] = {0, 0, 0, 0}, B[2] = {0, 0};
    if (lane == 0) {
      A[0] = a[2 * c] | (uint32_t(a[2 * c + 1]) << 16);
      B[0] = b[2 * c] | (uint32_t(b[2 * c + 1]) << 16);
    }
    float d[4] = {0, 0, 0, 0};
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]));
    if (lane == 0) out[c] = d[0];
  }
}
static uint16_t H(double v) {
  return __half_as_ushort(__float2half_rn((float)v));
}
static double D(uint16_t h) {
  return (double)__half2float(__ushort_as_half(h));
}
int main() {
  const int N = 4096;
  static uint16_t a[2 * N], b[2 * N];
  int n = 0;
  static const char* tag[N];
  static int ea[N], eb[N];
  auto add = [&](const char* t, double a0, double a1, double b0, double b1, int xa, int xb) {
    a[2 * n] = H(a0);
    a[2 * n + 1] = H(a1);
    b[2 * n] = H(b0);
    b[2 * n + 1] = H(b1);
    tag[n] = t;
    ea[n] = xa;
    eb[n] = xb;
    ++n;
  };
  for (int d = 1; d <= 7; d += 3)
    for (int e = -24; e <= 15; ++e) {
      add("sub*x", d * std::ldexp(1.0, -24), 0, 1.375 * std::ldexp(1.0, e), 0, -24, e);
      add("sub*x", d * std::ldexp(1.0, -18), 0, 1.375 * std::ldexp(1.0, e), 0, -18, e);
      add("int*x", d, 0, 1.375 * std::ldexp(1.0, e), 0, 0, e);
    }
  // hi + lo against a subnormal level: lo = hi * 2^-11 * 1.5
  for (int e = -20; e <= 12; ++e) {
    double hi = 1.375 * std::ldexp(1.0, e);
    add("sub*(hi,lo)", 3 * std::ldexp(1.0, -24), 3 * std::ldexp(1.0, -24), hi, hi * std::ldexp(1.0, -11) * 1.5, -24, e);
    add("int*(hi,lo)", 3, 3, hi, hi * std::ldexp(1.0, -11) * 1.5, 0, e);
  }
  uint16_t *da, *db;
  float* dout;
  cudaMalloc(&da, sizeof a);
  cudaMalloc(&db, sizeof b);
  cudaMalloc(&dout, 4 * N);
  cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
  K<<<1, 32>>>(da, db, dout, n);
  static float out[N];
  cudaError_t e = cudaMemcpy(out, dout, 4 * n, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    printf("cuda error %s\n", cudaGetErrorString(e));
    return 1;
  }
  int bad = 0;
  for (int c = 0; c < n; ++c) {
    double want = D(a[2 * c]) * D(b[2 * c]) + D(a[2 * c + 1]) * D(b[2 * c + 1]);
    double rel = want == 0 ? std::fabs(out[c]) : std::fabs(out[c] - want) / std::fabs(want);
    if (rel > 1e-7) {
      ++bad;
      printf("%-12s a 2^%d b 2^%d (%s): got %.9g want %.9g rel %.2e\n", tag[c], ea[c], eb[c],
             std::fabs(D(b[2 * c])) < 6.1e-5 ? "b subnormal" : "b normal", out[c], want, rel);
    }
  }
  printf("%d cases, %d inexact\n", n, bad);
  return 0;
}
