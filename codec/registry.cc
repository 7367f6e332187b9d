#include "codec/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace driftkv {

std::vector<std::string> KvCodecNames() { return {"dquant"}; }

absl::StatusOr<std::unique_ptr<KvCodec>> MakeKvCodec(const CodecOptions& o) {
  if (o.name == "dquant") {
    DQuantConfig c;
    c.kv_heads = o.kv_heads;
    c.head_dim = o.head_dim;
    c.key_levels = o.key_levels;
    c.value_levels = o.value_levels;
    c.key_bytes = o.key_bytes;
    c.value_bytes = o.value_bytes;
    c.alpha = o.alpha;
    c.mean_window = o.mean_window;
    absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(c);
    if (!codec.ok()) return codec.status();
    return std::unique_ptr<KvCodec>(new DQuantKvCodec(*std::move(codec)));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown codec \"", o.name, "\"; known: ",
                                                 absl::StrJoin(KvCodecNames(), ", ")));
}

}  // namespace driftkv
