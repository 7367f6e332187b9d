// The interface every KV codec of driftkv implements (D-Quant and the
// baselines of the quality benchmark), so that all of them share one pool
// layout, one CLI and one evaluation. The implementations live in their own
// headers (codec/dquant_kv_codec.h, codec/baselines/); codec/registry.h
// makes them by name.
//
// A codec turns the keys and values of one layer into fixed-size per-token
// records plus, for each block of up to block_tokens() consecutive tokens, an
// optional side record (D-Quant: the key channel mean of a window; KIVI: the
// per-channel key scales of a group). Token t of a layer therefore lives at
// key_records + t * key_stride(), and its block's side record at
// side_records + (t / block_tokens()) * side_stride(): addresses are
// computed, never looked up.
//
// Blocks are independent: a block can be encoded as soon as its tokens are
// known, and decoding one token needs only its records and its block's side
// record. Implementations are thread-compatible (const methods may run
// concurrently with separate scratch).
#ifndef DRIFTKV_CODEC_KV_CODEC_H_
#define DRIFTKV_CODEC_KV_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "codec/stream_codec.h"

namespace driftkv {

// Everything one thread needs to encode or decode with a codec; reuse
// across calls (the fields are D-Quant's working arrays; other codecs use
// what they need).
struct CodecScratch {
  StreamScratch stream;
  std::vector<float> rows;  // rotated tokens of one block
  std::vector<float> row;   // one rotated, mean-free stream
  std::vector<uint8_t> symbols;
};

struct CodecStats {
  StreamStats keys;
  StreamStats values;
  void Add(const CodecStats& o) {
    keys.Add(o.keys);
    values.Add(o.values);
  }
};

class KvCodec {
 public:
  virtual ~KvCodec() = default;

  virtual std::string name() const = 0;
  virtual int kv_heads() const = 0;
  virtual int head_dim() const = 0;
  int n() const { return kv_heads() * head_dim(); }

  virtual size_t key_stride() const = 0;
  virtual size_t value_stride() const = 0;
  virtual int block_tokens() const = 0;    // >= 1
  virtual size_t side_stride() const = 0;  // 0: no side records

  // What the service reports of the codec's settings (InfoResponse); zero
  // where a codec has no such knob.
  struct Settings {
    int key_levels = 0, value_levels = 0;
    int key_payload_bytes = 0, value_payload_bytes = 0;
    double alpha = 0.0;
    std::string value_refit;  // codec/stream_codec.h RefitName; empty: not D-Quant
  };
  virtual Settings settings() const { return Settings(); }

  // Largest |x| a key or value may have on entry to EncodeBlock (after any
  // transform); larger values are refused. No limit by default.
  virtual double max_abs_value() const { return 3.0e38; }

  // True stored bits per value, every byte counted (records and side
  // records of full blocks).
  double key_bits_per_value() const {
    return 8.0 * (key_stride() + static_cast<double>(side_stride()) / block_tokens()) / n();
  }
  double value_bits_per_value() const { return 8.0 * value_stride() / n(); }

  // Encodes one block of 1 <= count <= block_tokens() tokens;
  // keys/values are [count][kv_heads][head_dim]. `side` gets side_stride()
  // bytes (may be null when side_stride() == 0). Errors name the token.
  virtual absl::Status EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                                   uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                                   CodecStats* stats) const = 0;

  // Reconstructs `count` tokens of one block into [count][kv_heads][head_dim].
  // DataLoss on a corrupt record; never reads outside the given records.
  virtual absl::Status DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side,
                                   int count, float* keys, float* values, CodecScratch* scratch) const = 0;
};

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_KV_CODEC_H_
