// The transform flags of driftkv-codec eval, encode, decode and sweep:
//   --transform identity|hadamard|wush   (default: the codec's own rotation)
//   --transforms FILE                    (driftkv-calibrate's output; wush)
//   --layer L        the transforms of model layer L for every tensor layer;
//                    without it, tensor layer i uses model layer
//                    i % (layers in the file), which fits files laid out
//                    [sequence][layer] (the fixture, bench/kl_eval.py)
//   --values-folded  T_V is folded into the model's weights: values pass
//                    through untransformed. encode stores the given values
//                    as they are (a folded model emits v' = T_V v) and
//                    decode returns v'. eval and sweep are given the model's
//                    own values and simulate the folded model: they store
//                    v' = T_V v and report nmse_v and attn_rel_err in the
//                    model's domain (T_V^-1 applied to vhat' and to the
//                    attention output o', as the folded o_proj does),
//                    comparable with the unfolded figures
//                    (eval/codec_eval.h).
// Codecs are built per tensor layer, since the transforms differ by layer.
// A pool records its transform (codec/pool_file.h, PoolTransform); decode
// checks the flags against it and takes --layer and --values-folded from it.
#ifndef DRIFTKV_EVAL_TRANSFORM_FLAGS_H_
#define DRIFTKV_EVAL_TRANSFORM_FLAGS_H_

#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "codec/pool_file.h"
#include "codec/registry.h"
#include "codec/transform/transform.h"
#include "eval/flags.h"

namespace driftkv {

// Value flags and switches to add to a command's Flags::Parse sets.
const std::set<std::string>& TransformValueFlags();
const std::set<std::string>& TransformSwitches();
// `flags` plus TransformValueFlags().
std::set<std::string> WithTransformFlags(std::set<std::string> flags);

struct TransformChoice {
  bool given = false;  // --transform was passed
  TransformKind kind = TransformKind::kHadamard;
  TransformSet set;  // loaded for wush
  int layer = -1;    // --layer, or -1
  bool values_folded = false;
  uint64_t checksum = 0;  // wush: the transforms file's FNV-1a 64
};

// InvalidArgument on a bad combination (wush without --transforms, --rotation
// together with --transform, ...); the file's own errors otherwise.
absl::StatusOr<TransformChoice> TransformFromFlags(const Flags& f);

// The options as stored in a pool: rotation "identity" unless the transform
// is hadamard (unchanged when no --transform was given).
CodecOptions StoredOptions(CodecOptions options, const TransformChoice& t);

// What a pool written with `t` records (kind "" when no --transform).
PoolTransform PoolTransformOf(const TransformChoice& t);

// Decoding a pool with `options` and `stored`: InvalidArgument when the
// flags name another transform than the pool was written with (another
// rotation; a wush pool without --transform wush; a transforms file whose
// checksum differs, naming both; a --layer or --values-folded the pool does
// not record). For wush, t->layer and t->values_folded are then set from
// the pool. Pools that record no transform are decoded as the flags say.
absl::Status MatchPoolTransform(const CodecOptions& options, const PoolTransform& stored, const Flags& f,
                                TransformChoice* t);

// The codec for tensor layer `index` (see --layer above).
absl::StatusOr<std::unique_ptr<KvCodec>> MakeCodecForLayer(const CodecOptions& options, const TransformChoice& t,
                                                           int64_t index);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_TRANSFORM_FLAGS_H_
