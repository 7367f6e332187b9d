// One D-Quant stream (the n values of one token's keys or values at one
// layer) to one fixed-size record, and back.
//
// Record layout (little-endian), stride = RecordStride(C):
//   [0:2)      scale   fp16, the grid step s
//   [2:4)      offset  fp16, the grid origin o
//   [4:4+C)    payload C bytes of rANS (see rans.h), zero tail
//   [4+C:stride) zero padding to a multiple of 4 bytes
// Value j of the stream is reconstructed as o + s * m_j (computed in float,
// where s * m_j is exact because s has 11 significant bits and m_j < 16).
// Scale and offset come first so the payload starts 4-byte aligned.
//
// Encoding (Algorithm 1 plus the fit guarantee):
//   1. min-max grid: s = (max - min) / (M - 1), o = min;
//   2. drift to budget B = 8C - 32 bits of ideal cost;
//   3. least-squares refit of s, o to the assigned symbols; round to fp16;
//   4. drift again on the exact fp16 grid;
//   5. rANS into C bytes. Ideal costs are not the real length: if the real
//      stream is longer than C, drift again with the budget cut by the
//      measured excess plus a growing margin (a "retry"); after
//      kMaxRetries, take the cheapest-level assignment, and as the last
//      resort the all-cheapest-symbol stream, which Create() proved fits.
//      A stream therefore always fits; nothing is truncated.
//   6. with Refit::kUnbiased: the grid is refit once more to the final
//      symbols (the payload does not depend on the grid, so any grid decodes
//      it) such that the reconstruction is unbiased along the stream:
//      sum xhat = sum x and (xhat - x).(x - mean x) = 0, i.e.
//      s = Sxx / Sxm, o = mean x - s mean m (S: centred sums). Least squares
//      (s = Sxm / Smm) contracts every reconstruction toward its mean by
//      the correlation of x and m; unbiased scaling trades that coherent
//      shrink for a little more NMSE. Refit::kNormPreserving takes
//      s = sqrt(Sxx / Smm) instead (between the two). Step 6 is skipped
//      (the step-3 grid stays) when the final symbols correlate weakly with
//      x (Sxm^2 < Sxx Smm / 2, e.g. a fallback stream) or the grid would
//      leave fp16.
#ifndef DRIFTKV_CODEC_STREAM_CODEC_H_
#define DRIFTKV_CODEC_STREAM_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/final_grid.h"
#include "codec/format_constants.h"
#include "codec/rans.h"

namespace driftkv {

// kRecordHeaderBytes (fp16 scale + fp16 offset), kRecordAlign and
// kMaxRetries: codec/format_constants.h.

inline size_t RecordStride(int payload_bytes) {
  return (static_cast<size_t>(payload_bytes) + kRecordHeaderBytes + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

// What encoding one stream did; summed over streams by the callers.
struct StreamStats {
  int64_t streams = 0;
  int64_t symbols = 0;
  int64_t bytes_used = 0;    // rANS bytes including the 4-byte state
  int64_t bytes_budget = 0;  // C per stream
  int64_t moved = 0;         // symbols differing from nearest rounding
  int max_move = 0;          // largest |m - nearest| in levels
  int64_t retries = 0;       // re-solves because the real length overflowed
  int64_t fallbacks = 0;     // streams that needed a cheapest-level fallback
  int64_t constant = 0;      // streams with max == min

  void Add(const StreamStats& o);
};

// Scratch space for one encoding thread; reused across streams.
struct StreamScratch {
  std::vector<float> u;
  std::vector<uint8_t> symbols;
  std::vector<uint8_t> nearest;
  std::vector<uint8_t> rans;
};

// How the stored grid (scale, offset) is fitted to the symbols.
enum class Refit {
  kLeastSquares = kRefitLeastSquares,      // steps 1-5 alone: step 3's grid
  kUnbiased = kRefitUnbiased,              // plus step 6
  kNormPreserving = kRefitNormPreserving,  // step 6 with s = sqrt(Sxx / Smm)
};

// "least_squares" / "unbiased" / "norm", and back (InvalidArgument naming the text).
const char* RefitName(Refit r);
absl::StatusOr<Refit> ParseRefit(const std::string& name);

class StreamCodec {
 public:
  // n values per stream, M levels, C payload bytes, frequencies f[0..M).
  // Fails if the parameters are out of range or C cannot hold even the
  // cheapest stream (the error names the minimum C).
  static absl::StatusOr<StreamCodec> Create(int n, int levels, int payload_bytes, const uint16_t* freq);

  // The smallest payload that holds the all-cheapest-symbol stream.
  static absl::StatusOr<int> MinPayloadBytes(int n, int levels, const uint16_t* freq);

  int n() const { return n_; }
  int levels() const { return table_.levels; }
  int payload_bytes() const { return payload_bytes_; }
  size_t stride() const { return RecordStride(payload_bytes_); }
  const RansTable& table() const { return table_; }
  Refit refit() const { return refit_; }
  void set_refit(Refit r) { refit_ = r; }

  // Encodes x[0..n) into record[0..stride()). x must be finite and within
  // the fp16 range (|x| <= 65504), else InvalidArgument naming the value.
  // On OK scratch->symbols[0..n) holds the symbols the record codes.
  absl::Status Encode(const float* x, uint8_t* record, StreamScratch* scratch, StreamStats* stats) const;

  // Decodes the symbols and the grid of a record. On DataLoss the outputs
  // are defined (symbols in [0, M)) but meaningless.
  absl::Status DecodeSymbols(const uint8_t* record, uint8_t* symbols, float* scale, float* offset) const;

  // Decodes `count` (1 or 2) consecutive records of a contiguous array
  // (stride() apart) at once; two streams decode nearly twice as fast as
  // one after the other. symbols: count * n; scale/offset: count each.
  // Returns the first error.
  absl::Status DecodeSymbolsUpTo2(const uint8_t* records, int count, uint8_t* symbols, float* scale,
                                  float* offset) const;

  // Decodes to values o + s * m.
  absl::Status Decode(const uint8_t* record, float* x) const;

 private:
  StreamCodec() = default;
  // Tries assignments until one fits; writes the payload, returns bytes used.
  size_t EncodeFitting(const float* u, float scale, uint8_t* payload, StreamScratch* scratch, StreamStats* stats) const;

  int n_ = 0;
  int payload_bytes_ = 0;
  int cheapest_ = 0;  // lowest-index level of minimum cost
  Refit refit_ = Refit::kLeastSquares;
  RansTable table_;
};

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_STREAM_CODEC_H_
