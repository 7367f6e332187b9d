#include "eval/transform_flags.h"

#include "absl/strings/str_cat.h"

namespace driftkv {

const std::set<std::string>& TransformValueFlags() {
  static const std::set<std::string> names = {"transform", "transforms", "layer"};
  return names;
}

const std::set<std::string>& TransformSwitches() {
  static const std::set<std::string> names = {"values-folded"};
  return names;
}

std::set<std::string> WithTransformFlags(std::set<std::string> flags) {
  flags.insert(TransformValueFlags().begin(), TransformValueFlags().end());
  return flags;
}

absl::StatusOr<TransformChoice> TransformFromFlags(const Flags& f) {
  TransformChoice t;
  if (!f.Has("transform")) {
    if (f.Has("transforms") || f.Has("layer") || f.Has("values-folded")) {
      return absl::InvalidArgumentError("--transforms, --layer and --values-folded need --transform wush");
    }
    return t;
  }
  t.given = true;
  absl::StatusOr<TransformKind> kind = ParseTransformKind(f.Str("transform"));
  if (!kind.ok()) return kind.status();
  t.kind = *kind;
  if (f.Has("rotation")) return absl::InvalidArgumentError("give --transform or --rotation, not both");
  if (t.kind != TransformKind::kWush) {
    if (f.Has("transforms") || f.Has("layer") || f.Has("values-folded")) {
      return absl::InvalidArgumentError("--transforms, --layer and --values-folded need --transform wush");
    }
    return t;
  }
  if (!f.Has("transforms")) return absl::InvalidArgumentError("--transform wush needs --transforms FILE");
  absl::StatusOr<TransformSet> set = ReadTransformsFile(f.Str("transforms"));
  if (!set.ok()) return set.status();
  t.set = *std::move(set);
  absl::Status st = f.Num("layer", &t.layer);
  if (!st.ok()) return st;
  if (f.Has("layer") && (t.layer < 0 || t.layer >= t.set.layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layer ", t.layer, " out of range [0, ", t.set.layers, ") of ", f.Str("transforms")));
  }
  t.values_folded = f.Has("values-folded");
  t.checksum = TransformsChecksum(t.set);
  return t;
}

PoolTransform PoolTransformOf(const TransformChoice& t) {
  PoolTransform p;
  if (!t.given) return p;
  p.kind = t.kind == TransformKind::kWush ? "wush" : t.kind == TransformKind::kHadamard ? "hadamard" : "identity";
  if (t.kind == TransformKind::kWush) {
    p.layer = t.layer;
    p.values_folded = t.values_folded;
    p.transforms_checksum = t.checksum;
  }
  return p;
}

absl::Status MatchPoolTransform(const CodecOptions& options, const PoolTransform& stored, const Flags& f,
                                TransformChoice* t) {
  if (t->given && StoredOptions(options, *t).rotation != options.rotation) {
    return absl::InvalidArgumentError(
        absl::StrCat("--transform ", f.Str("transform"), " does not match the pool's rotation ", options.rotation));
  }
  if (stored.kind.empty()) return absl::OkStatus();
  const bool wush = t->given && t->kind == TransformKind::kWush;
  if (stored.kind != "wush") {
    if (wush) {
      return absl::InvalidArgumentError(
          absl::StrCat("the pool was encoded with --transform ", stored.kind, ", not wush"));
    }
    return absl::OkStatus();
  }
  const std::string stored_sum = absl::StrCat(absl::Hex(stored.transforms_checksum, absl::kZeroPad16));
  if (!wush) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pool was encoded with --transform wush (transforms file checksum ", stored_sum,
                     "); decode it with --transform wush --transforms FILE"));
  }
  if (t->checksum != stored.transforms_checksum) {
    return absl::InvalidArgumentError(
        absl::StrCat("--transforms ", f.Str("transforms"), " has checksum ", absl::Hex(t->checksum, absl::kZeroPad16),
                     " but the pool was encoded with transforms of checksum ", stored_sum));
  }
  if (f.Has("layer") && t->layer != stored.layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layer ", t->layer, " differs from the pool's transform_layer ", stored.layer));
  }
  if (f.Has("values-folded") && !stored.values_folded) {
    return absl::InvalidArgumentError("--values-folded, but the pool's values were encoded transformed");
  }
  t->layer = stored.layer;
  t->values_folded = stored.values_folded;
  return absl::OkStatus();
}

CodecOptions StoredOptions(CodecOptions options, const TransformChoice& t) {
  if (t.given) options.rotation = t.kind == TransformKind::kHadamard ? "hadamard" : "identity";
  return options;
}

absl::StatusOr<std::unique_ptr<KvCodec>> MakeCodecForLayer(const CodecOptions& options, const TransformChoice& t,
                                                           int64_t index) {
  if (!t.given) return MakeKvCodec(options);
  const int layer = t.kind != TransformKind::kWush ? 0
                    : t.layer >= 0                 ? t.layer
                                                   : static_cast<int>(index % t.set.layers);
  return MakeTransformedCodec(options, t.kind, t.kind == TransformKind::kWush ? &t.set : nullptr, layer,
                              t.values_folded);
}

}  // namespace driftkv
