// Exact base-M packing of n symbols in [0, M): the stream is the integer
// V = sum_i m_i * M^i, stored little-endian in BaseMBytes(n, M) bytes, the
// fewest bytes that hold M^n - 1. This stores n symbols in
// ceil(n * log2(M) / 8) bytes: the ideal log2 M bits per symbol of the
// paper's fixed-width control, rounded up once per stream (< 8 bits), not
// once per symbol. Costs O(n^2 log M / 32) word operations per stream.
#ifndef DRIFTKV_CODEC_BASELINES_BASE_M_H_
#define DRIFTKV_CODEC_BASELINES_BASE_M_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace driftkv {
namespace baselines {

constexpr int kMinBaseM = 2;
constexpr int kMaxBaseM = 256;  // symbols are bytes

// Exact (computes the bit length of M^n - 1), n >= 1, M in [2, 256].
size_t BaseMBytes(int n, int m);

// `limbs` is scratch. Writes exactly `bytes` = BaseMBytes(n, m) bytes.
void PackBaseM(const uint8_t* symbols, int n, int m, size_t bytes, uint8_t* out, std::vector<uint32_t>* limbs);

// DataLoss if the stored integer is >= M^n (no symbol string encodes to it);
// the symbols are then still in [0, M).
absl::Status UnpackBaseM(const uint8_t* in, size_t bytes, int n, int m, uint8_t* symbols, std::vector<uint32_t>* limbs);

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_BASE_M_H_
