// The pool file written by `driftkv-codec encode`: the layers of one
// sequence as a KvCodec stores them, behind a header that says how to read
// them. Byte-level layout in docs/format.md ("Pool file"); in short
// (little-endian):
//
//   [0:8)     magic "DKVPOOL\0"
//   [8:12)    version (2; readers take 1 and 2)
//   [12:16)   header_bytes: offset of layer 0
//   [16:20)   layers           [20:24)  tokens per layer
//   [24:28)   kv_heads         [28:32)  head_dim
//   [32:36)   compressed tokens per layer (the rest are the bf16 window)
//   [36:40)   block_tokens     [40:44)  key_stride
//   [44:48)   value_stride     [48:52)  side_stride
//   [52:56)   options_bytes    [56:64)  layer_stride (u64)
//   [64:96)   key frequencies, 16 x u16 (D-Quant; zero otherwise)
//   [96:128)  value frequencies, 16 x u16
//   [128:128+options_bytes) codec options, "key=value" text, space separated,
//            then the transform stage's keys when one was given (PoolTransform)
//   zero padding to header_bytes (a multiple of 64)
//   layer l at header_bytes + l * layer_stride:
//     key records   [compressed][key_stride]
//     value records [compressed][value_stride]
//     side records  [ceil(compressed / block_tokens)][side_stride]
//     window keys   [tokens - compressed][kv_heads][head_dim] bf16
//     window values [tokens - compressed][kv_heads][head_dim] bf16
//
// Versions: 1 stores key_bytes=0 / value_bytes=0 for D-Quant's default
// containers, "the default for n" of the writer's release; 2 (the same
// layout) always stores the resolved payload sizes, so that a later change
// of the default cannot change how a file reads. A reader resolves the 0 of
// a version 1 file with LegacyDefaultPayloadBytes (codec/dquant_codec.h),
// the rule of every release that wrote version 1, and a 0 in a version 2
// D-Quant file is refused.
//
// Reading checks the magic, the version, that the codec rebuilt from the
// options has the stored strides and frequencies, and the file size; every
// failure is a status naming the field.
#ifndef DRIFTKV_CODEC_POOL_FILE_H_
#define DRIFTKV_CODEC_POOL_FILE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/encoded_layer.h"
#include "codec/registry.h"

namespace driftkv {

constexpr char kPoolMagic[8] = {'D', 'K', 'V', 'P', 'O', 'O', 'L', '\0'};
constexpr uint32_t kPoolVersion = 2;
constexpr uint32_t kPoolFirstResolvedVersion = 2;  // key_bytes/value_bytes never 0
constexpr int kPoolFixedHeaderBytes = 128;

// The transform stage (codec/transform/transform.h) the pool was written behind,
// stored after the codec options as
//   transform=KIND [transform_layer=L values_folded=0|1 transforms_fnv=HEX16]
// (the bracketed keys for wush only), so that a reader can insist on the
// same stage. Files without these keys (kind "") predate them or were
// written without --transform: the codec's `rotation` option says it all.
struct PoolTransform {
  std::string kind;                  // "", "identity", "hadamard" or "wush"
  int layer = -1;                    // wush: the file's layer used for every tensor layer, or -1
                                     // (tensor layer i used layer i % the file's layers)
  bool values_folded = false;        // wush: values were stored untransformed
  uint64_t transforms_checksum = 0;  // wush: the transforms file's trailing FNV-1a 64
};

struct Pool {
  // As read: D-Quant's key_bytes/value_bytes resolved (never 0). SerializePool
  // writes the payloads of `codec` in place of a 0.
  CodecOptions options;
  PoolTransform transform;
  // Built from `options` alone: for wush the inner codec (rotation
  // identity); its records decode to the transformed domain.
  std::unique_ptr<KvCodec> codec;
  int64_t tokens = 0;
  std::vector<EncodedLayer> layers;
};

std::string FormatCodecOptions(const CodecOptions& o);
absl::StatusOr<CodecOptions> ParseCodecOptions(const std::string& text);

// Serialises / parses the whole file in memory.
absl::StatusOr<std::string> SerializePool(const Pool& pool);
absl::StatusOr<Pool> ParsePool(const std::string& bytes);

absl::Status WritePoolFile(const std::string& path, const Pool& pool);
absl::StatusOr<Pool> ReadPoolFile(const std::string& path);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_POOL_FILE_H_
