// The D-Quant codec of one model shape: keys and values of a token at one
// layer are two streams of n = kv_heads * head_dim values each.
//
// Keys:   k -> Hadamard per head -> minus the window's channel mean -> stream.
// Values: v -> Hadamard per head -> stream.
// The key channel mean is taken over a window of W consecutive tokens
// (positions [wW, (w+1)W) of a layer, in the rotated domain), quantised to
// INT8 with one fp32 scale, and stored once per window in a "mean record":
//   [0:4)    scale  fp32 LE, mu_j = q_j * scale
//   [4:4+n)  q      int8, channel j = head * head_dim + dim
//   [4+n:mean_stride) zero padding to a multiple of 4
// The encoder subtracts the dequantised mean, so decode adds back exactly
// what was removed. A window may hold fewer than W tokens (the tail of a
// sequence); its mean is then over the tokens it holds.
//
// All functions are thread-compatible: a const DQuantCodec may be shared by
// threads that each pass their own scratch.
#ifndef DRIFTKV_CODEC_DQUANT_CODEC_H_
#define DRIFTKV_CODEC_DQUANT_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/format_constants.h"
#include "codec/hadamard.h"
#include "codec/kv_codec.h"
#include "codec/page_layout.h"
#include "codec/stream_codec.h"

namespace driftkv {

// Defaults of the paper for n = 1024: 331/231 payload bytes, 8/6 levels.
constexpr int kDefaultKeyLevels = 8;
constexpr int kDefaultValueLevels = 6;
constexpr int kReferenceStreamLength = 1024;
constexpr int kReferenceKeyBytes = 331;
constexpr int kReferenceValueBytes = 231;
constexpr double kDefaultAlpha = 1.4;
constexpr int kDefaultMeanWindow = 128;
constexpr Refit kDefaultValueRefit = Refit::kUnbiased;
// kMeanHeaderBytes: codec/format_constants.h.

struct DQuantConfig {
  int kv_heads = 0;
  int head_dim = 0;
  int key_levels = kDefaultKeyLevels;
  int value_levels = kDefaultValueLevels;
  // Payload bytes per stream; 0 picks DefaultPayloadBytes for this n (331
  // and 231 at n = 1024). DQuantCodec::config() holds the resolved sizes.
  int key_bytes = 0;
  int value_bytes = 0;
  double alpha = kDefaultAlpha;
  int mean_window = kDefaultMeanWindow;
  // Rotate each head by the normalised Hadamard matrix (the paper) or not
  // (identity: the caller applies its own transform, e.g. WUSH-KV).
  bool hadamard = true;
  // How the value grid is fitted to the value symbols (codec/stream_codec.h);
  // keys always use least squares.
  Refit value_refit = kDefaultValueRefit;

  int n() const { return kv_heads * head_dim; }
  // Range checks of every field, with messages naming field and value.
  absl::Status Validate() const;
};

class DQuantCodec {
 public:
  static absl::StatusOr<DQuantCodec> Create(const DQuantConfig& config);

  const DQuantConfig& config() const { return config_; }
  int n() const { return config_.n(); }
  const StreamCodec& key_codec() const { return keys_; }
  const StreamCodec& value_codec() const { return values_; }
  size_t key_stride() const { return keys_.stride(); }
  size_t value_stride() const { return values_.stride(); }
  size_t mean_stride() const;
  // The page of one mean window (codec/page_layout.h): mean_window tokens'
  // key and value records and the window's mean record.
  PageLayout page_layout() const;
  // Stored bits per value of keys and values, every byte counted: records
  // plus one mean record per full window.
  double key_bits_per_value() const;
  double value_bits_per_value() const;

  // Encodes `count` tokens (1 <= count <= mean_window) forming one mean
  // window. keys/values are [count][kv_heads][head_dim] floats in the model's
  // domain. Writes count records to each record array and one mean record.
  // On error nothing useful is written and the status names the token.
  // If key_each / value_each are not null they receive each token's own
  // stream statistics (arrays of `count`), e.g. for per-stream histograms.
  // If key_symbols / value_symbols are not null they receive the symbols
  // each record codes, [count][n] (what DecodeSymbols would give back),
  // for writing a level page without decoding the records.
  absl::Status EncodeWindow(const float* keys, const float* values, int count, uint8_t* key_records,
                            uint8_t* value_records, uint8_t* mean_record, CodecScratch* scratch, StreamStats* key_stats,
                            StreamStats* value_stats, StreamStats* key_each = nullptr,
                            StreamStats* value_each = nullptr, uint8_t* key_symbols = nullptr,
                            uint8_t* value_symbols = nullptr) const;

  // Reconstructs one token into the model's domain ([kv_heads][head_dim]).
  absl::Status DecodeKey(const uint8_t* record, const uint8_t* mean_record, float* out, CodecScratch* scratch) const;
  absl::Status DecodeValue(const uint8_t* record, float* out, CodecScratch* scratch) const;
  // The reconstruction after the symbols are known (from a record, or from a
  // level page of the hot tier, codec/level_page.h): the same float
  // operations as DecodeKey / DecodeValue, so both give the same bits.
  void KeyFromSymbols(const uint8_t* symbols, float scale, float offset, const uint8_t* mean_record, float* out,
                      CodecScratch* scratch) const;
  void ValueFromSymbols(const uint8_t* symbols, float scale, float offset, float* out) const;

  // Applies the codec's per-head rotation to `heads` rows of head_dim
  // values (its own inverse): Hadamard, or nothing.
  void Rotate(float* x, int heads) const {
    if (config_.hadamard) HadamardHeads(x, heads, config_.head_dim);
  }

  // The dequantised mean of a mean record, in the rotated domain (n floats).
  static void LoadMean(const uint8_t* mean_record, int n, float* mu);

 private:
  DQuantCodec(const DQuantConfig& c, StreamCodec k, StreamCodec v)
      : config_(c), keys_(std::move(k)), values_(std::move(v)) {}

  DQuantConfig config_;
  StreamCodec keys_;
  StreamCodec values_;
};

// The resolved payload size C of a stream of n values when key_bytes
// (value_bytes) is 0; `reference_bytes` is the reference payload R at n =
// 1024 (kReferenceKeyBytes or kReferenceValueBytes). docs/api.md "Default
// containers" writes the rule out.
//   n >= kCodedBitsRuleBelow: LegacyDefaultPayloadBytes, the reference's
//     stored bits per value (the defaults of every earlier release).
//   n <  kCodedBitsRuleBelow: a record's 8 fixed bytes (grid and rANS state)
//     are charged to the record, not to the payload: the smallest C that
//     codes the reference's bits per value, CodedBitsPerValue(C, n) >=
//     CodedBitsPerValue(R, 1024), but not less than the smallest payload
//     that holds a stream, rounded up to a multiple of 4 (the stride's
//     alignment bytes, which cost no memory).
int DefaultPayloadBytes(int n, int reference_bytes, int levels, double alpha);

// Where DefaultPayloadBytes switches rules. The legacy rule codes 98% of
// the reference's bits per value at n = 512 and 92% at n = 256 against the
// 95% of kQualityEnvelopeShare; shapes from 512 up keep their containers.
constexpr int kCodedBitsRuleBelow = 512;

// The default of every n in earlier releases, which still resolves the
// key_bytes=0 / value_bytes=0 of the pool files they wrote (version 1,
// codec/pool_file.h) and recognises the sizes of their servers'
// snapshots: the record stride is the reference stride's share for
// n, rounded to a multiple of 4, and the payload at most the reference
// payload's share, but never less than the smallest payload that holds a
// stream (StreamCodec::MinPayloadBytes). Below n = 512 it codes fewer bits
// per value than the reference (the fixed bytes take a growing share).
int LegacyDefaultPayloadBytes(int n, int reference_bytes, int levels, double alpha);

// Bits per value the rANS coder may spend on a stream of n values in a
// payload of C bytes: 8 C less the flushed state (kStateBits), over n.
// A record also stores a 4-byte grid, so 8 of its bytes are fixed costs:
// keeping the reference's *stored* bits per value (LegacyDefaultPayloadBytes)
// codes fewer bits at small n (keys 2.55 and values 1.77 at n = 1024, 2.38
// and 1.63 at n = 256; at n = 128 the values' payload is the smallest that
// holds any stream, the all-central one), which DefaultPayloadBytes avoids
// below n = 512.
double CodedBitsPerValue(int payload_bytes, int n);

// The quality envelope (docs/quality.md "Small shapes"): streams whose
// coded bits per value are at least this share of the reference's (n =
// 1024, 331 and 231 bytes) meet the documented NMSE bars. Measured at the
// legacy containers: n = 512 codes 98-99% of the reference's bits and
// meets them; n = 256 codes 92-93% and its value NMSE is 24% higher. The
// default containers are inside it at every n; pinned ones may not be.
constexpr double kQualityEnvelopeShare = 0.95;

// Empty when both streams of `codec` are inside the envelope; otherwise one
// line for the server's stderr naming n, the payloads, the coded bits per
// value against the reference's, and the payloads that would code the
// reference's bits (at least, and the defaults for n).
std::string QualityEnvelopeWarning(const DQuantCodec& codec);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_DQUANT_CODEC_H_
