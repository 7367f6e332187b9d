// GPU D-Quant encode (paper Sec. 4.5): a batch of tokens to records in the
// page layout of kernels/attention.h, one warp per stream.
//
// Two launches: (1) one block per 128-token window rotates the keys
// (Hadamard per head, the butterfly order of codec/hadamard.cc) and writes the
// window's mean record exactly as DQuantCodec::EncodeWindow does (double
// sums, INT8 with one fp32 scale); (2) one warp per stream: rotation, key mean
// removal, min-max grid, drift (Lagrangian bisection of codec/drift.h with
// warp reductions), least-squares refit, fp16 rounding, drift on the fp16
// grid, rANS (lane 0; the byte order of codec/rans.h), and the same retries
// and cheapest-level fallbacks as StreamCodec::EncodeFitting, so every stream
// fits its container; then the alphabet's final grid refit (codec/
// final_grid.h), which changes only the record's scale and offset. Records decode with the CPU codec and the GPU
// decoder alike (the format is the decoder's).
#ifndef DRIFTKV_KERNELS_ENCODE_H_
#define DRIFTKV_KERNELS_ENCODE_H_

#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "codec/format_constants.h"
#include "kernels/attention.h"

namespace driftkv {
namespace gpu {

// One alphabet as the encoder needs it (host-built by MakeEncodeAlphabets
// of kernels/codec_bridge.h, passed by value).
struct EncodeAlphabet {
  int levels = 0;
  int payload_bytes = 0;  // C
  int cheapest = 0;       // lowest-index level of maximum frequency
  uint16_t freq[kMaxLevels] = {};
  uint16_t cum[kMaxLevels] = {};
  float cost_bits[kMaxLevels] = {};
  // The grid refit after the final drift (codec/final_grid.h kRefit*; keys
  // always kRefitLeastSquares, i.e. none).
  int refit = 0;
};

// Per-stream outcome, [tokens][2] (keys, values), optional.
struct EncodeStreamStats {
  int32_t bytes_used;  // rANS bytes including the state
  int16_t retries;     // re-solves after a real length over C
  int8_t fallback;     // 1: cheapest-level fallback, 2: one-symbol stream
  int8_t error;        // 1: a value not finite or beyond the fp16 range
  int16_t moved;       // symbols differing from nearest rounding (codec/stream_codec.h StreamStats)
  int8_t max_move;     // largest |m - nearest| in levels
  int8_t constant;     // 1: max == min (or the grid underflowed fp16): scale 0
};

struct EncodeParams {
  PageLayout layout;
  EncodeAlphabet keys;
  EncodeAlphabet values;
  const float* keys_dev = nullptr;  // [tokens][kv_heads][head_dim], model domain
  const float* values_dev = nullptr;
  // false: no Hadamard rotation (a codec built with rotation "identity",
  // e.g. behind the WUSH transform of kernels/transform.h, which the caller
  // applies to keys_dev/values_dev first).
  bool rotate = true;
  int tokens = 0;                      // token t goes to page pages[t / 128], slot t % 128
  const int32_t* pages_dev = nullptr;  // [ceil(tokens / 128)]
  uint8_t* pool_dev = nullptr;
  EncodeStreamStats* stats_dev = nullptr;  // may be null
};

// A plain GPU decoder of records (one thread per stream), for cross-decoding
// tests: out [tokens][2][n] = o + s * m (+ mu for keys), the rotated domain,
// computed in the CPU's operation order; ok [tokens][2] = 1 when the stream
// passes the checks of codec/rans.cc RansDecode.
struct DecodeRecordsParams {
  PageLayout layout;
  const uint8_t* pool_dev = nullptr;
  const int32_t* pages_dev = nullptr;
  int tokens = 0;
  const uint32_t* tables_dev = nullptr;  // PackDecodeTable: keys, then values
  int key_payload = 0;                   // C of keys and values
  int value_payload = 0;
  float* out_dev = nullptr;
  int32_t* ok_dev = nullptr;
};

absl::Status LaunchDecodeRecords(const DecodeRecordsParams& p, cudaStream_t stream);

// Enqueues both launches on `stream`.
absl::Status LaunchEncode(const EncodeParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_ENCODE_H_
