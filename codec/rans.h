// rANS with 8-bit probabilities, byte-wise renormalisation, one 32-bit state,
// into a payload of exactly C bytes. READ THIS FIRST:
//
// - Probabilities are integer frequencies f[m] >= 1 with sum 2^kProbBits = 256;
//   c[m] is the cumulative frequency. A symbol's ideal cost is -log2(f/256).
// - The state x lives in [kStateLow, 256 * kStateLow) = [2^23, 2^31) between
//   symbols. Encoding emits whole bytes to keep it there; decoding pulls them
//   back. With 8-bit probabilities a decode step shrinks x by at most 8 bits
//   (x' >= x >> 8 >= 2^15), so ONE byte always restores x >= 2^23: the decoder
//   renormalises with a single `if`, never a loop. 31 bits, not 32, so that
//   f * (x >> 8) + bias < 255 * 2^23 + 255 fits in uint32 without wrapping.
// - The encoder runs over the symbols in reverse (last symbol first), writing
//   bytes backwards, and finally writes its state (4 bytes, little-endian) in
//   front. The decoder reads that state from payload[0..4) and then consumes
//   bytes forward, producing symbols in their original order.
// - The used bytes sit at the front of the payload; the tail up to C bytes is
//   zero. The encoder starts from x = kStateLow, so a correct decode ends with
//   x == kStateLow: the decoder checks this, and that it never ran past C.
// - The final state costs sigma = 32 bits: an assignment whose ideal cost is
//   at most 8C - 32 almost always fits; the caller handles the rare case
//   where it does not (EncodeStream retries).
#ifndef DRIFTKV_CODEC_RANS_H_
#define DRIFTKV_CODEC_RANS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "codec/format_constants.h"
#include "codec/rans_encode_step.h"

namespace driftkv {

// kProbBits, kStateLow, kStateHigh, kStateBytes, kMaxLevels, ...: in
// codec/format_constants.h, shared with the GPU kernels.

// One entry of the 256-entry decode table, indexed by z = x mod 256:
//   [7:0]   f       frequency of the symbol whose interval holds z (1..255)
//   [15:8]  bias    z - c, so that x' = f * (x >> 8) + bias
//   [19:16] symbol  the level index m (0..15)
//   [31:20] zero
using DecodeEntry = uint32_t;

inline uint32_t EntryFreq(DecodeEntry e) {
  return (e >> kEntryFreqShift) & 0xffu;
}
inline uint32_t EntryBias(DecodeEntry e) {
  return (e >> kEntryBiasShift) & 0xffu;
}
inline uint32_t EntrySymbol(DecodeEntry e) {
  return (e >> kEntrySymbolShift) & 0xfu;
}

// Frequencies of one alphabet, with everything the coder derives from them.
struct RansTable {
  int levels = 0;                       // M
  uint16_t freq[kMaxLevels] = {};       // f[m], sum 256
  uint16_t cum[kMaxLevels] = {};        // c[m] = f[0] + ... + f[m-1]
  float cost_bits[kMaxLevels] = {};     // -log2(f[m] / 256)
  DecodeEntry decode[kProbScale] = {};  // indexed by x mod 256
  RansEncodeEntry encode[kMaxLevels];   // the step's form of f[m], c[m]
};

// Builds the table from frequencies. Fails unless 2 <= levels <= 16, every
// f >= 1 and the sum is 256.
absl::Status BuildRansTable(const uint16_t* freq, int levels, RansTable* table);

// Encodes symbols[0..n) (each < table.levels) into payload[0..capacity).
// Returns the number of bytes the stream needs (state included). When that is
// <= capacity the payload holds the stream and a zero tail; otherwise the
// payload contents are unspecified and the caller must try another
// assignment. `scratch` must hold at least n + kStateBytes bytes.
size_t RansEncode(const uint8_t* symbols, int n, const RansTable& table, uint8_t* payload, size_t capacity,
                  uint8_t* scratch);

// Decodes n symbols from payload[0..capacity). Never reads outside the
// payload. Returns DataLoss if the initial state is out of range, the stream
// runs past the payload, or the final state is not kStateLow (the stream is
// corrupt); symbols[0..n) are then unspecified but written.
absl::Status RansDecode(const uint8_t* payload, size_t capacity, int n, const RansTable& table, uint8_t* symbols);

// Decodes two independent streams of the same length and table at once. The
// two dependency chains interleave, so this runs close to twice the speed of
// two RansDecode calls. Same guarantees and results as RansDecode for each.
void RansDecodePair(const uint8_t* payload_a, const uint8_t* payload_b, size_t capacity, int n, const RansTable& table,
                    uint8_t* symbols_a, uint8_t* symbols_b, absl::Status* status_a, absl::Status* status_b);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_RANS_H_
