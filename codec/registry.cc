#include "codec/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/baselines/bf16_codec.h"
#include "codec/baselines/fixed_codec.h"
#include "codec/baselines/fp8_codec.h"
#include "codec/baselines/int_codec.h"
#include "codec/baselines/kivi_codec.h"
#include "codec/baselines/oscar_codec.h"
#include "codec/baselines/turbo_codec.h"
#include "codec/dquant_kv_codec.h"

namespace driftkv {
namespace {

absl::StatusOr<std::unique_ptr<KvCodec>> MakeDQuant(const CodecOptions& o) {
  DQuantConfig c;
  c.kv_heads = o.kv_heads;
  c.head_dim = o.head_dim;
  c.key_levels = o.key_levels;
  c.value_levels = o.value_levels;
  c.key_bytes = o.key_bytes;
  c.value_bytes = o.value_bytes;
  c.alpha = o.alpha;
  c.mean_window = o.mean_window;
  c.value_refit = o.value_refit;
  c.hadamard = o.rotation == "hadamard";
  if (o.rotation != "hadamard" && o.rotation != "identity") {
    return absl::InvalidArgumentError(absl::StrCat("rotation \"", o.rotation, "\" unknown; use hadamard or identity"));
  }
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(c);
  if (!codec.ok()) return codec.status();
  return std::unique_ptr<KvCodec>(new DQuantKvCodec(*std::move(codec)));
}

}  // namespace

std::vector<std::string> KvCodecNames() {
  return {"dquant", "int", "kivi", "oscar", "turbo", "fixed", "fp8", "bf16"};
}

absl::StatusOr<std::unique_ptr<KvCodec>> MakeKvCodec(const CodecOptions& o) {
  const int h = o.kv_heads, d = o.head_dim;
  if (o.name == "dquant") return MakeDQuant(o);
  if (o.name == "int") {
    if (o.rotation != "hadamard" && o.rotation != "identity") {
      return absl::InvalidArgumentError(
          absl::StrCat("rotation \"", o.rotation, "\" unknown; use hadamard or identity"));
    }
    return baselines::MakeIntCodec(h, d, o.bits, o.group, o.rotation == "hadamard");
  }
  if (o.name == "kivi") return baselines::KiviCodec::Create(h, d, o.bits, o.group);
  if (o.name == "oscar") {
    return baselines::MakeOscarCodec(h, d, o.bits, o.group, o.kappa_k, o.kappa_v);
  }
  if (o.name == "turbo") return baselines::TurboCodec::Create(h, d, o.bits, o.group, o.seed);
  // `fixed` reads D-Quant's level counts: --k-levels/--v-levels are its M.
  if (o.name == "fixed") {
    return baselines::FixedCodec::Create(h, d, o.key_levels, o.value_levels, o.mean_window);
  }
  if (o.name == "fp8") return baselines::Fp8Codec::Create(h, d);
  if (o.name == "bf16") return baselines::Bf16Codec::Create(h, d);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec \"", o.name, "\"; known: ", absl::StrJoin(KvCodecNames(), ", ")));
}

}  // namespace driftkv
