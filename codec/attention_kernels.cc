#include "codec/attention_kernels.h"

#include <algorithm>
#include <cstddef>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "wire/half.h"

namespace driftkv {
namespace {

// Query heads of one KV head that share a pass over its tokens (the GQA
// groups of common models are 1 to 8 heads; registers hold 4).
constexpr int kRunHeads = 4;
// How many tokens ahead the weighted sums prefetch their rows.
constexpr int kPrefetchTokens = 8;

inline float ToFloat(uint8_t level) {
  return static_cast<float>(level);
}
inline float ToFloat(uint16_t bf16) {
  return Bf16ToFloat(bf16);
}

inline float Combine8(const float* a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// ---- portable --------------------------------------------------------------

template <typename T>
void DotsPortable(const AttentionShape& s, const float* q, const T* x, int count, float* dots) {
  const int d = s.head_dim, n = s.n();
  for (int t = 0; t < count; ++t) {
    for (int h = 0; h < s.q_heads; ++h) {
      const float* qh = q + static_cast<size_t>(h) * d;
      const T* m = x + static_cast<size_t>(t) * n + static_cast<size_t>(h / s.group) * d;
      float acc[8] = {};
      int i = 0;
      for (; i + 8 <= d; i += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += qh[i + k] * ToFloat(m[i + k]);
      }
      for (; i < d; ++i) acc[i & 7] += qh[i] * ToFloat(m[i]);
      dots[static_cast<size_t>(t) * s.q_heads + h] = Combine8(acc);
    }
  }
}

template <typename T>
void AccumulatePortable(const AttentionShape& s, const float* c, const T* x, int count, float* acc) {
  const int d = s.head_dim, n = s.n();
  for (int h = 0; h < s.q_heads; ++h) {
    float* a = acc + static_cast<size_t>(h) * d;
    const T* base = x + static_cast<size_t>(h / s.group) * d;
    for (int t = 0; t < count; ++t) {
      const float w = c[static_cast<size_t>(t) * s.q_heads + h];
      const T* m = base + static_cast<size_t>(t) * n;
      for (int i = 0; i < d; ++i) a[i] += w * ToFloat(m[i]);
    }
  }
}

const AttentionKernels kPortable = {"portable", DotsPortable<uint8_t>, DotsPortable<uint16_t>,
                                    AccumulatePortable<uint8_t>, AccumulatePortable<uint16_t>};

// ---- AVX2 --------------------------------------------------------------------
#if defined(__x86_64__)
#define DRIFTKV_AVX2 __attribute__((target("avx2")))

DRIFTKV_AVX2 inline __m256 Load8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
DRIFTKV_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Combine8 of up to four accumulators at once, element h of the result
// for acc[h]: lo + hi gives (a0 + a4, a1 + a5, a2 + a6, a3 + a7); two
// horizontal adds then pair elements (0, 1) and (2, 3), then the two pairs.
DRIFTKV_AVX2 inline __m128 Combine4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  const __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
  const __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
  const __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
  return _mm_hadd_ps(_mm_hadd_ps(s0, s1), _mm_hadd_ps(s2, s3));
}

// kHeads query heads (rows of q, d apart) against one KV head's channels
// in kTokens tokens (rows of m, n apart): lane k of acc[t][h] is the
// partial sum over i = k mod 8. The tokens share the loads of q.
template <typename T, int kHeads, int kTokens>
DRIFTKV_AVX2 void DotRunAvx2(const float* q, int d, const T* m, int n, float* dots, int dots_stride) {
  __m256 acc[kTokens][kHeads];
  for (int t = 0; t < kTokens; ++t) {
    for (int h = 0; h < kHeads; ++h) acc[t][h] = _mm256_setzero_ps();
  }
  int i = 0;
  for (; i + 8 <= d; i += 8) {
    __m256 v[kTokens];
    for (int t = 0; t < kTokens; ++t) v[t] = Load8(m + static_cast<size_t>(t) * n + i);
    for (int h = 0; h < kHeads; ++h) {
      const __m256 qh = _mm256_loadu_ps(q + h * d + i);
      for (int t = 0; t < kTokens; ++t) acc[t][h] = _mm256_add_ps(acc[t][h], _mm256_mul_ps(qh, v[t]));
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    float* out = dots + t * dots_stride;
    if (i == d) {
      __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int h = 0; h < kHeads; ++h) a[h] = acc[t][h];
      alignas(16) float r[4];
      _mm_store_ps(r, Combine4(a[0], a[1], a[2], a[3]));
      for (int h = 0; h < kHeads; ++h) out[h] = r[h];
      continue;
    }
    const T* row = m + static_cast<size_t>(t) * n;
    for (int h = 0; h < kHeads; ++h) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[t][h]);
      for (int k = i; k < d; ++k) a[k & 7] += q[h * d + k] * ToFloat(row[k]);
      out[h] = Combine8(a);
    }
  }
}

template <typename T, int kTokens>
DRIFTKV_AVX2 void DotTokensAvx2(const AttentionShape& s, const float* q, const T* x, float* dots) {
  const int d = s.head_dim, n = s.n(), group = s.group, q_heads = s.q_heads;
  for (int h = 0; h < q_heads;) {
    const int heads = std::min(kRunHeads, group - h % group);
    const float* qh = q + static_cast<size_t>(h) * d;
    const T* m = x + static_cast<size_t>(h / group) * d;
    switch (heads) {
      case 1: DotRunAvx2<T, 1, kTokens>(qh, d, m, n, dots + h, q_heads); break;
      case 2: DotRunAvx2<T, 2, kTokens>(qh, d, m, n, dots + h, q_heads); break;
      case 3: DotRunAvx2<T, 3, kTokens>(qh, d, m, n, dots + h, q_heads); break;
      default: DotRunAvx2<T, 4, kTokens>(qh, d, m, n, dots + h, q_heads); break;
    }
    h += heads;
  }
}

template <typename T>
DRIFTKV_AVX2 void DotsAvx2(const AttentionShape& s, const float* q, const T* x, int count, float* dots) {
  const size_t n = s.n(), q_heads = s.q_heads;
  int t = 0;
  for (; t + 2 <= count; t += 2) DotTokensAvx2<T, 2>(s, q, x + t * n, dots + t * q_heads);
  if (t < count) DotTokensAvx2<T, 1>(s, q, x + t * n, dots + t * q_heads);
}

// kHeads query heads of one KV head: acc rows d apart, weights c[t * c_stride
// + h], tokens of m n apart. Sixteen channels (two registers a head) stay in
// registers over all tokens.
template <typename T, int kHeads>
DRIFTKV_AVX2 void AccumulateRunAvx2(const float* c, int c_stride, const T* m, int n, int count, int d, float* acc) {
  int i = 0;
  for (; i + 16 <= d; i += 16) {
    __m256 lo[kHeads], hi[kHeads];
    for (int h = 0; h < kHeads; ++h) {
      lo[h] = _mm256_loadu_ps(acc + h * d + i);
      hi[h] = _mm256_loadu_ps(acc + h * d + i + 8);
    }
    for (int t = 0; t < count; ++t) {
      const T* row = m + static_cast<size_t>(t) * n + i;
      // Tokens are n elements apart: a stride the hardware prefetcher may
      // not follow when the rows come from memory (the bf16 window).
      if (t + kPrefetchTokens < count) {
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchTokens * static_cast<size_t>(n)), _MM_HINT_T0);
      }
      const __m256 v0 = Load8(row), v1 = Load8(row + 8);
      const float* w = c + static_cast<size_t>(t) * c_stride;
      for (int h = 0; h < kHeads; ++h) {
        const __m256 wh = _mm256_set1_ps(w[h]);
        lo[h] = _mm256_add_ps(lo[h], _mm256_mul_ps(wh, v0));
        hi[h] = _mm256_add_ps(hi[h], _mm256_mul_ps(wh, v1));
      }
    }
    for (int h = 0; h < kHeads; ++h) {
      _mm256_storeu_ps(acc + h * d + i, lo[h]);
      _mm256_storeu_ps(acc + h * d + i + 8, hi[h]);
    }
  }
  if (i + 8 <= d) {
    __m256 a[kHeads];
    for (int h = 0; h < kHeads; ++h) a[h] = _mm256_loadu_ps(acc + h * d + i);
    for (int t = 0; t < count; ++t) {
      const __m256 v = Load8(m + static_cast<size_t>(t) * n + i);
      const float* w = c + static_cast<size_t>(t) * c_stride;
      for (int h = 0; h < kHeads; ++h) a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(_mm256_set1_ps(w[h]), v));
    }
    for (int h = 0; h < kHeads; ++h) _mm256_storeu_ps(acc + h * d + i, a[h]);
    i += 8;
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int t = 0; t < count; ++t) {
      const float w = c[static_cast<size_t>(t) * c_stride + h];
      const T* row = m + static_cast<size_t>(t) * n;
      for (int k = i; k < d; ++k) acc[h * d + k] += w * ToFloat(row[k]);
    }
  }
}

template <typename T>
DRIFTKV_AVX2 void AccumulateAvx2(const AttentionShape& s, const float* c, const T* x, int count, float* acc) {
  const int d = s.head_dim, n = s.n(), group = s.group, q_heads = s.q_heads;
  for (int h = 0; h < q_heads;) {
    const int heads = std::min(kRunHeads, group - h % group);
    const T* m = x + static_cast<size_t>(h / group) * d;
    float* a = acc + static_cast<size_t>(h) * d;
    switch (heads) {
      case 1: AccumulateRunAvx2<T, 1>(c + h, q_heads, m, n, count, d, a); break;
      case 2: AccumulateRunAvx2<T, 2>(c + h, q_heads, m, n, count, d, a); break;
      case 3: AccumulateRunAvx2<T, 3>(c + h, q_heads, m, n, count, d, a); break;
      default: AccumulateRunAvx2<T, 4>(c + h, q_heads, m, n, count, d, a); break;
    }
    h += heads;
  }
}

const AttentionKernels kAvx2 = {"avx2", DotsAvx2<uint8_t>, DotsAvx2<uint16_t>, AccumulateAvx2<uint8_t>,
                                AccumulateAvx2<uint16_t>};
#endif  // __x86_64__

}  // namespace

const AttentionKernels& PortableAttentionKernels() {
  return kPortable;
}

const AttentionKernels* Avx2AttentionKernels() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? &kAvx2 : nullptr;
#else
  return nullptr;
#endif
}

const AttentionKernels& BestAttentionKernels() {
  const AttentionKernels* avx2 = Avx2AttentionKernels();
  return avx2 != nullptr ? *avx2 : kPortable;
}

}  // namespace driftkv
