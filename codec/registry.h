// Codecs by name, for the CLI, the evaluation tools and the service config.
#ifndef DRIFTKV_CODEC_REGISTRY_H_
#define DRIFTKV_CODEC_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/dquant_codec.h"
#include "codec/kv_codec.h"

namespace driftkv {

// Every knob of every codec; each codec reads the ones it uses.
struct CodecOptions {
  std::string name = "dquant";
  int kv_heads = 0;
  int head_dim = 0;
  // dquant (and `fixed`, which uses the same preprocessing and levels)
  int key_levels = kDefaultKeyLevels;
  int value_levels = kDefaultValueLevels;
  int key_bytes = 0;    // 0: default for n
  int value_bytes = 0;  // 0: default for n
  double alpha = kDefaultAlpha;
  int mean_window = kDefaultMeanWindow;
  Refit value_refit = kDefaultValueRefit;  // dquant only
  // int, kivi, oscar, turbo
  int bits = 2;
  int group = 128;
  double kappa_k = 0.96;
  double kappa_v = 0.92;
  uint64_t seed = 0x5eed;  // turbo's random rotation
  // The per-head rotation before quantisation: "hadamard" (default) or
  // "identity" (for callers that apply their own transform, e.g. WUSH).
  // Honoured by dquant and int; the other codecs always use their own.
  std::string rotation = "hadamard";
};

// The names MakeKvCodec accepts, in a stable order.
std::vector<std::string> KvCodecNames();

// InvalidArgument naming the codec or the option that is out of range.
absl::StatusOr<std::unique_ptr<KvCodec>> MakeKvCodec(const CodecOptions& options);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_REGISTRY_H_
