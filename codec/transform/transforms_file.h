// The transforms file of driftkv-calibrate: for every (layer, KV head) the
// WUSH-KV key and value transforms and their inverses, float32.
//
// Byte layout (docs/format.md, section "Transforms file"), little-endian:
//   [0:8)    magic "DKVXFRM\0"
//   [8:12)   u32 version, kTransformsVersion (1)
//   [12:16)  u32 layers L
//   [16:20)  u32 kv_heads H
//   [20:24)  u32 head_dim D (a power of two)
//   [24:28)  u32 flags: bit 0 = value Hessian from W_O (else identity)
//   [28:32)  u32 key centering window W (0: none): the key Gram matrix was
//            taken over k - (mean of its block of W tokens), as D-Quant
//            subtracts its window channel mean before quantizing
//   [32:40)  f64 damping gamma
//   [40:48)  u64 calibration key tokens per layer (summed over the inputs)
//   [48:48+16*L*H*D*D) for l in [0, L), h in [0, H): four D x D row-major
//            f32 matrices T_K, T_K^-1, T_V, T_V^-1 (x' = T x)
//   last 8   u64 FNV-1a 64 of every byte before it
// A reader checks magic, version, sizes and the checksum and reports which
// failed; no field is trusted before the checksum matches.
#ifndef DRIFTKV_CODEC_TRANSFORM_TRANSFORMS_FILE_H_
#define DRIFTKV_CODEC_TRANSFORM_TRANSFORMS_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace driftkv {

constexpr char kTransformsMagic[8] = {'D', 'K', 'V', 'X', 'F', 'R', 'M', '\0'};
constexpr uint32_t kTransformsVersion = 1;
constexpr size_t kTransformsHeaderBytes = 8 + 4 * 6 + 8 + 8;
static_assert(kTransformsHeaderBytes == 48, "header layout above");
constexpr uint32_t kTransformsFlagValueWo = 1;

// Which of the four matrices of a head.
enum class Mat { kKey = 0, kKeyInverse = 1, kValue = 2, kValueInverse = 3 };

struct TransformSet {
  int layers = 0, kv_heads = 0, head_dim = 0;
  uint32_t flags = 0;
  uint32_t key_center_window = 0;
  double gamma = 0.0;
  uint64_t calibration_tokens = 0;
  std::vector<float> data;  // [layers][kv_heads][4][head_dim][head_dim]

  size_t matrix_floats() const { return static_cast<size_t>(head_dim) * head_dim; }
  void Resize() { data.assign(static_cast<size_t>(layers) * kv_heads * 4 * matrix_floats(), 0.0f); }
  float* matrix(int layer, int head, Mat m) {
    return data.data() + ((static_cast<size_t>(layer) * kv_heads + head) * 4 + static_cast<int>(m)) * matrix_floats();
  }
  const float* matrix(int layer, int head, Mat m) const {
    return const_cast<TransformSet*>(this)->matrix(layer, head, m);
  }
};

std::string SerializeTransforms(const TransformSet& set);
// The file's trailing FNV-1a 64 for `set`: what SerializeTransforms writes
// last, so for a set read from a file it is that file's checksum (parsing
// and serialising round-trip byte for byte). Identifies the transforms a
// pool or a server was built with.
uint64_t TransformsChecksum(const TransformSet& set);
// DataLoss naming the field on a bad magic, version, size or checksum.
absl::StatusOr<TransformSet> ParseTransforms(const std::string& bytes);

absl::Status WriteTransformsFile(const std::string& path, const TransformSet& set);
absl::StatusOr<TransformSet> ReadTransformsFile(const std::string& path);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_TRANSFORM_TRANSFORMS_FILE_H_
