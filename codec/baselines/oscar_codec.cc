#include "codec/baselines/oscar_codec.h"

#include "codec/baselines/int_codec.h"

namespace driftkv {
namespace baselines {

absl::StatusOr<std::unique_ptr<KvCodec>> MakeOscarCodec(int kv_heads, int head_dim, int bits, int group, double kappa_k,
                                                        double kappa_v) {
  GroupSpec k;
  k.n = kv_heads * head_dim;
  k.group = group;
  k.bits = bits;
  GroupSpec v = k;
  k.kappa = kappa_k;
  v.kappa = kappa_v;
  absl::StatusOr<std::unique_ptr<GroupAffineCodec>> c =
      GroupAffineCodec::Create("oscar", kv_heads, head_dim, /*rotate=*/true, k, v);
  if (!c.ok()) return c.status();
  return std::unique_ptr<KvCodec>(std::move(*c));
}

}  // namespace baselines
}  // namespace driftkv
