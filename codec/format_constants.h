// The constants of the stored format and of the encoder's search, in one
// self-contained header (no other include of the project, no absl) that
// both the CPU codec and the CUDA kernels (nvcc) compile, so that a GPU
// decoder or encoder can never disagree with the CPU about them. Each
// kernel that bakes one of them into code (an inline-PTX literal, a table
// width) states the relation with a static_assert next to that code.
#ifndef DRIFTKV_CODEC_FORMAT_CONSTANTS_H_
#define DRIFTKV_CODEC_FORMAT_CONSTANTS_H_

#include <cstdint>

namespace driftkv {

// rANS (codec/rans.h, READ THIS FIRST there).
constexpr int kProbBits = 8;                      // frequencies sum to 2^8
constexpr uint32_t kProbScale = 1u << kProbBits;  // 256 table entries
constexpr uint32_t kStateLow = 1u << 23;          // L
constexpr uint32_t kStateHigh = kStateLow << 8;   // 2^31, exclusive
constexpr int kStateBytes = 4;                    // flushed final state
constexpr int kStateBits = 8 * kStateBytes;       // sigma of the paper
constexpr int kMaxLevels = 16;                    // symbols of one alphabet
constexpr int kMinLevels = 2;
static_assert(kStateLow % kProbScale == 0, "L must be a multiple of 2^p");
static_assert(kStateHigh <= (1u << 31), "state must leave headroom below 2^32");
static_assert((kStateLow >> 8) << kProbBits == kStateLow, "one renormalisation byte restores x >= L");

// One entry of the CPU decode table (codec/rans.h DecodeEntry):
//   [7:0] f   [15:8] bias = z - c   [19:16] symbol.
constexpr int kEntryFreqShift = 0;
constexpr int kEntryBiasShift = 8;
constexpr int kEntrySymbolShift = 16;
static_assert(kMaxLevels <= 16, "the symbol field is 4 bits wide");

// Records (codec/stream_codec.h): fp16 scale + fp16 offset, then the
// payload; strides a multiple of 4 bytes; at most kMaxRetries re-solves
// when a real rANS length exceeds the payload.
constexpr int kRecordHeaderBytes = 4;
constexpr int kRecordAlign = 4;
constexpr int kMaxRetries = 16;

// The key-mean record (codec/dquant_codec.h): fp32 scale, then n INT8.
constexpr int kMeanHeaderBytes = 4;

// Drift (codec/drift.h): bisection steps over the multiplier and the width
// of its initial bracket in octaves.
constexpr int kDriftBisectionSteps = 12;
constexpr double kDriftBracketOctaves = 40.0;

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_FORMAT_CONSTANTS_H_
