// THE log-sum-exp merge of partial attention: one definition for the CPU
// backend's split-KV parts, the WUSH stage's pages + window
// (codec/transform/transform_attention.cc) and the GPU merge kernel
// (kernels/merge.cu). Self-contained so that nvcc compiles it too.
//
// A partial softmax state of one query head over a set of tokens is
// (m, l, acc): m the largest scaled score, l = sum exp(s - m), acc =
// sum exp(s - m) v. A normalised partial output (out, lse) is the state
// (lse, 1, out). The empty state (m = -inf, l = 0, acc = 0) merges to
// nothing. States over disjoint tokens merge as
//   M = max_k m_k,  w_k = exp(m_k - M) (0 for an empty state),
//   l = sum_k w_k l_k,  acc = sum_k w_k acc_k,
// giving out = acc / l and lse = M + log l (out = 0, lse = -inf when every
// part is empty).
#ifndef DRIFTKV_CODEC_LSE_MERGE_H_
#define DRIFTKV_CODEC_LSE_MERGE_H_

#include "codec/host_device.h"

namespace driftkv {

// w_k of the rule above for a part whose max (or lse) is m_k, in a merge
// whose maximum is m_max, computed in `Real` with `exp` (std::exp in double
// on the host, __expf on the device).
template <typename Real, typename Exp>
DRIFTKV_HOST_DEVICE inline Real LseWeight(float m_k, float m_max, Exp exp) {
  return m_k == -__builtin_huge_valf() ? Real(0) : exp(static_cast<Real>(m_k) - static_cast<Real>(m_max));
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_LSE_MERGE_H_
