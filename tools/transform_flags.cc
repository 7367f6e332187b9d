#include "tools/transform_flags.h"

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
    return absl::InvalidArgumentError(absl::StrCat("--layer ", t.layer, " out of range [0, ", t.set.layers,
                                                   ") of ", f.Str("transforms")));
  }
  t.values_folded = f.Has("values-folded");
  return t;
}

CodecOptions StoredOptions(CodecOptions options, const TransformChoice& t) {
  if (t.given) options.rotation = t.kind == TransformKind::kHadamard ? "hadamard" : "identity";
  return options;
}

absl::StatusOr<std::unique_ptr<KvCodec>> MakeCodecForLayer(const CodecOptions& options, const TransformChoice& t,
                                                           int64_t index) {
  if (!t.given) return MakeKvCodec(options);
  const int layer = t.kind != TransformKind::kWush ? 0
                    : t.layer >= 0                  ? t.layer
                                                    : static_cast<int>(index % t.set.layers);
  return MakeTransformedCodec(options, t.kind, t.kind == TransformKind::kWush ? &t.set : nullptr, layer,
                              t.values_folded);
}

}  // namespace driftkv
