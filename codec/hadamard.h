// Normalised Walsh-Hadamard transform of one head (Sylvester order), in place.
//
// H = H_2 (x) ... (x) H_2 / sqrt(d) is symmetric and orthonormal, so it is its
// own inverse: applying it twice returns the input (up to float rounding).
// The butterflies run in a fixed order (stride 1, 2, 4, ...) and the 1/sqrt(d)
// factor is applied last; the CUDA backend follows the same order.
#ifndef DRIFTKV_CODEC_HADAMARD_H_
#define DRIFTKV_CODEC_HADAMARD_H_

namespace driftkv {

inline bool IsPowerOfTwo(int d) {
  return d > 0 && (d & (d - 1)) == 0;
}

// x[0..d), d a power of two.
void HadamardInPlace(float* x, int d);

// Every head of a [heads][d] row.
inline void HadamardHeads(float* x, int heads, int d) {
  for (int h = 0; h < heads; ++h) HadamardInPlace(x + static_cast<long>(h) * d, d);
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_HADAMARD_H_
