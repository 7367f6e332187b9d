// The vector loops of AttentionCore (codec/compressed_attention.h), over a
// run of tokens of one sequence stored [token][n] (n = kv_heads * head_dim,
// channel j = kv_head * head_dim + i), either as key/value levels (uint8_t,
// small integers, exact as floats) or as bf16 bits (the window):
//
//   Dots:       dots[t][h] = sum_i q[h][i] * x[t][kv(h) * d + i]
//   Accumulate: acc[h][i] += c[t][h] * x[t][kv(h) * d + i], t = 0, 1, ...
//
// with kv(h) = h / group (GQA). Both run in a FIXED ORDER of float
// operations, the same on every machine and for every split of the tokens
// into calls, so that an item's answer does not depend on the batch, the
// thread or the CPU:
//   - a dot product runs in eight partial sums, acc[k] over i = k mod 8 in
//     order of i, each step a multiply then an add (never fused), combined
//     as ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7));
//   - an accumulator element takes its tokens in order of t, one multiply
//     then one add each.
// Two implementations perform exactly these operations: portable C++ and
// AVX2 (eight lanes are the eight partial sums; no FMA, which would round
// once where the portable code rounds twice). The build targets x86-64-v2,
// so AVX2 is chosen at run time when the CPU has it; codec/BUILD compiles
// with -ffp-contract=off so that no -march fuses the portable code either.
#ifndef DRIFTKV_CODEC_ATTENTION_KERNELS_H_
#define DRIFTKV_CODEC_ATTENTION_KERNELS_H_

#include <cstdint>

namespace driftkv {

struct AttentionShape {
  int q_heads = 0;   // query heads, a multiple of kv heads
  int group = 1;     // query heads per KV head
  int head_dim = 0;  // d
  int n() const { return q_heads / group * head_dim; }
};

// q and acc: [q_heads][head_dim]; x: [count][n]; dots and c:
// [count][q_heads]. count >= 0.
struct AttentionKernels {
  const char* name;
  void (*dots_levels)(const AttentionShape& s, const float* q, const uint8_t* x, int count, float* dots);
  void (*dots_bf16)(const AttentionShape& s, const float* q, const uint16_t* x, int count, float* dots);
  void (*accumulate_levels)(const AttentionShape& s, const float* c, const uint8_t* x, int count, float* acc);
  void (*accumulate_bf16)(const AttentionShape& s, const float* c, const uint16_t* x, int count, float* acc);
};

// The portable implementation (any CPU).
const AttentionKernels& PortableAttentionKernels();
// The AVX2 implementation, or null when the CPU lacks AVX2 (or is not x86).
const AttentionKernels* Avx2AttentionKernels();
// The fastest of the two this CPU runs.
const AttentionKernels& BestAttentionKernels();

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_ATTENTION_KERNELS_H_
