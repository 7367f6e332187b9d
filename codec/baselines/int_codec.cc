#include "codec/baselines/int_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"

namespace driftkv {
namespace baselines {

absl::StatusOr<std::unique_ptr<GroupAffineCodec>> GroupAffineCodec::Create(std::string name, int kv_heads, int head_dim,
                                                                           bool rotate, const GroupSpec& keys,
                                                                           const GroupSpec& values) {
  if (kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": shape ", kv_heads, " x ", head_dim, " must be positive"));
  }
  if (rotate && !IsPowerOfTwo(head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": head_dim ", head_dim, " must be a power of two (Hadamard rotation)"));
  }
  absl::Status st = ValidateGroupSpec(keys, "keys");
  if (st.ok()) st = ValidateGroupSpec(values, "values");
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", st.message()));
  return std::unique_ptr<GroupAffineCodec>(
      new GroupAffineCodec(std::move(name), kv_heads, head_dim, rotate, keys, values));
}

void GroupAffineCodec::EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const {
  const int n = this->n();
  scratch->row.resize(n);
  scratch->symbols.resize(n);
  float* row = scratch->row.data();
  std::memcpy(row, x, sizeof(float) * n);
  if (rotate_) HadamardHeads(row, kv_heads(), head_dim());
  EncodeGroups(key ? keys_ : values_, row, record, scratch->symbols.data(), &scratch->rows);
}

absl::Status GroupAffineCodec::DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const {
  scratch->symbols.resize(n());
  absl::Status st = DecodeGroups(key ? keys_ : values_, record, x, scratch->symbols.data());
  if (rotate_) HadamardHeads(x, kv_heads(), head_dim());
  return st;
}

absl::StatusOr<std::unique_ptr<KvCodec>> MakeIntCodec(int kv_heads, int head_dim, int bits, int group, bool rotate) {
  GroupSpec spec;
  spec.n = kv_heads * head_dim;
  spec.group = group;
  spec.bits = bits;
  absl::StatusOr<std::unique_ptr<GroupAffineCodec>> c =
      GroupAffineCodec::Create("int", kv_heads, head_dim, rotate, spec, spec);
  if (!c.ok()) return c.status();
  return std::unique_ptr<KvCodec>(std::move(*c));
}

}  // namespace baselines
}  // namespace driftkv
