// The level page's decoders on the device (codec/level_page.h's layout):
// a key group's 16 pairs as fp16 subnormals and a value byte pair's three
// digits as exact fp16 levels, in registers, ready as mma.m16n8k16 A
// fragments. kernels/level_attention.cu runs them; kernels/level_decode.cu holds
// their exhaustive self-test (LevelDecodeSelfTest).
#ifndef DRIFTKV_KERNELS_LEVEL_DECODE_CUH_
#define DRIFTKV_KERNELS_LEVEL_DECODE_CUH_

#include <cstdint>

namespace driftkv {
namespace gpu {

__device__ __forceinline__ uint32_t Hsub2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t Hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t Hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// fp16 constants in both halves.
constexpr uint32_t kH1025 = 0x64016401u, kH1280 = 0x65006500u, kH811 = 0x62566256u, kH989 = 0x63ba63bau;
constexpr uint32_t kHRecip36 = 0x271b271bu;  // fp16 0.0277557, 0.08% under 1/36
constexpr uint32_t kHRecip6 = 0x31573157u;   // fp16 0.1668701, 0.12% over 1/6
constexpr uint32_t kHMinus36 = 0xd080d080u, kHMinus6 = 0xc600c600u;

// Key pairs as fp16 subnormals: a level in bits [p, p + 3) of a half
// whose exponent bits are zero is the fp16 number level * 2^(p - 24),
// exact, so one mask (after a shift for most fields) decodes a pair, with
// no exponent to OR in and take away. The tensor cores multiply subnormal
// fp16 operands exactly, like any other. A field lands at p = 0, 3 or 6
// (kKeyPairPos), so the levels of a k-step come in three scales; the two
// registers that meet the same B register (a0 and a1: channels 2t, 2t + 1;
// a2 and a3: 2t + 8, 2t + 9) always share one, and the query's B fragments
// carry the inverse, 2^(6 - p) (QueryFragments): every product is level *
// query * 2^-18 times the query's power of two, undone in the score's
// scale. The pairs (e = 0..15 of a group, k-step e / 4, register e % 4):
//   0, 1: fields 0, 1 of W0 at p = 0 (W0, W0 >> 3)
//   2, 3: fields 2, 3 of W0 at p = 6 (W0, W0 >> 3)
//   4, 5: field 4 of W0 and field 0 of W1 at p = 0 (W0 >> 12, W1)
//   6, 7: fields 1, 2 of W1 at p = 3 (W1, W1 >> 3)
//   8, 9: fields 3, 4 of W1 at p = 6 (W1 >> 3, W1 >> 6)
//  10, 11: fields 0, 1 of W2 at p = 0 (W2, W2 >> 3)
//  12, 13: fields 2, 3 of W2 at p = 6 (W2, W2 >> 3)
//  14, 15: field 4 of W2 (W2 >> 12) and pair 15's bits at p = 0.
__device__ constexpr int kKeyPairPos[16] = {0, 0, 6, 6, 0, 0, 3, 3, 6, 6, 0, 0, 6, 6, 0, 0};
constexpr uint32_t kKeyMask0 = 0x00070007u, kKeyMask3 = 0x00380038u, kKeyMask6 = 0x01c001c0u;

// The 16 pairs of one key group (words w0 w1 w2, codec/level_page.h).
__device__ __forceinline__ void KeyGroupPairs(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t (&pr)[16]) {
  const uint32_t w0s3 = w0 >> 3, w1s3 = w1 >> 3, w2s3 = w2 >> 3;
  pr[0] = w0 & kKeyMask0;
  pr[1] = w0s3 & kKeyMask0;
  pr[2] = w0 & kKeyMask6;
  pr[3] = w0s3 & kKeyMask6;
  pr[4] = (w0 >> 12) & kKeyMask0;
  pr[5] = w1 & kKeyMask0;
  pr[6] = w1 & kKeyMask3;
  pr[7] = w1s3 & kKeyMask3;
  pr[8] = w1s3 & kKeyMask6;
  pr[9] = (w1 >> 6) & kKeyMask6;
  pr[10] = w2 & kKeyMask0;
  pr[11] = w2s3 & kKeyMask0;
  pr[12] = w2 & kKeyMask6;
  pr[13] = w2s3 & kKeyMask6;
  pr[14] = (w2 >> 12) & kKeyMask0;
  // Pair 15: bit b of each level in bit 15 / 31 of word b.
  pr[15] = ((w0 >> 15) & 0x00010001u) | ((w1 >> 14) & 0x00020002u) | ((w2 >> 13) & 0x00040004u);
}

// The value decoder's byte 0x65 (of 1280 + b) comes in a register: as an
// immediate, each byte pair was a MOV and a PRMT. The attention kernel
// loads it from shared memory, where the compiler cannot see its value.
struct DecodeConsts {
  uint32_t bytes65;  // 0x65656565
};
__device__ __forceinline__ DecodeConsts MakeDecodeConsts() {
  return DecodeConsts{0x65656565u};
}

// The three base-6 digits of two bytes, byte 0 and byte 2 of `word` (sel
// 0x4240) or bytes 1 and 3 (sel 0x4341), as exact fp16 level pairs, in
// half-precision arithmetic: x = 1280 + b (the byte under 0x65); each
// digit is a floor division done as one fused multiply-add whose exact
// result lands in [1024, 2048), where fp16 steps by 1, so its rounding to
// nearest gives the biased quotient:
//   l2 = fp16(x * fp16(1/36) + 989) - 1025,  rm = x - 36 l2 = 1280 + r,
//   l1 = fp16(rm * fp16(1/6) + 811) - 1025,  l0 = rm - 6 l1 - 1280.
// The constants were found by trying every fp16 pair near the quotients
// (docs/hot_tier/triple_constants.py: the exact sums stay 0.0012 and
// 0.066 away from a rounding boundary);
// LevelDecodeSelfTest checks all 216 x 216 byte pairs on the GPU. 8
// instructions for three pairs (a byte permute, 7 f16x2 operations).
template <uint32_t kSel>
__device__ __forceinline__ void Triple(uint32_t word, const DecodeConsts& c, uint32_t& d0, uint32_t& d1, uint32_t& d2) {
  uint32_t x;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(x) : "r"(word), "r"(c.bytes65), "n"(kSel));
  const uint32_t l2 = Hsub2(Hfma2(x, kHRecip36, kH989), kH1025);
  const uint32_t rm = Hfma2(l2, kHMinus36, x);  // 1280 + r
  const uint32_t l1 = Hsub2(Hfma2(rm, kHRecip6, kH811), kH1025);
  d0 = Hsub2(Hfma2(l1, kHMinus6, rm), kH1280);
  d1 = l1;
  d2 = l2;
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int k) {
  return k == 0 ? v.x : (k == 1 ? v.y : (k == 2 ? v.z : v.w));
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_DECODE_CUH_
