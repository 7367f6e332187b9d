// The WUSH-KV transform stage on the GPU: per-(layer, KV head)
// D x D matrices applied to keys and values before the encoder, to queries
// before the fused attention kernel, and to its output in the merge kernel.
//
// DEVICE FORM. For every (layer, kv head) four float matrices A, each used as
//   out[i] = sum_{j = 0..D-1} A[j * D + i] * x[j]     (j ascending, no FMA)
// which is exactly the order and rounding of codec/transform/transform.cc MatVec, so
// the GPU's transformed keys and values are bit-identical to
// LayerTransform's and a page encoded on the GPU equals the one
// TransformedKvCodec writes:
//   kTfKey    = T_K^T        (k' = T_K k)
//   kTfQuery  = (H T_K^-T)^T (H q' with q' = T_K^-T q; the fused kernel
//                             applies its Hadamard H to every query, and
//                             H H = I; float rounding differs from
//                             LayerTransform::Queries by ~1e-7 relative)
//   kTfValue  = T_V^T        (v' = T_V v)
//   kTfOutput = (T_V^-1)^T   (o = T_V^-1 o')
// Matrix (layer, head, m) starts at ((layer * kv_heads + head) * 4 + m) * D * D.
#ifndef DRIFTKV_KERNELS_TRANSFORM_H_
#define DRIFTKV_KERNELS_TRANSFORM_H_

#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace driftkv {
namespace gpu {

enum TransformMatrix { kTfKey = 0, kTfQuery = 1, kTfValue = 2, kTfOutput = 3 };

struct HeadTransformParams {
  const float* mats_dev = nullptr;  // device form above
  int layers = 0, kv_heads = 0, head_dim = 0;
  int matrix = kTfKey;
  // rows of `heads` vectors of head_dim floats; head h of a row uses KV head
  // h / (heads / kv_heads) of layer layer_dev[row / rows_per_layer].
  const float* in_dev = nullptr;  // [rows][heads][head_dim]
  float* out_dev = nullptr;       // same shape; may equal in_dev
  int rows = 0, heads = 0;
  const int32_t* layer_dev = nullptr;
  int rows_per_layer = 1;
};

// One block per (row, head). InvalidArgument for head_dim outside
// [1, 128] or heads not a multiple of kv_heads. A layer index outside
// [0, layers) leaves that vector's output as NaN (callers validate layers
// on the host first).
absl::Status LaunchHeadTransform(const HeadTransformParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_TRANSFORM_H_
