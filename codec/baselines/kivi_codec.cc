#include "codec/baselines/kivi_codec.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/baselines/common.h"

namespace driftkv {
namespace baselines {

absl::StatusOr<std::unique_ptr<KvCodec>> KiviCodec::Create(int kv_heads, int head_dim, int bits, int group) {
  if (kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kivi: shape ", kv_heads, " x ", head_dim, " must be positive"));
  }
  GroupSpec v;
  v.n = kv_heads * head_dim;
  v.group = group;
  v.bits = bits;
  absl::Status st = ValidateGroupSpec(v, "kivi");
  if (!st.ok()) return st;
  return std::unique_ptr<KvCodec>(new KiviCodec(kv_heads, head_dim, v));
}

size_t KiviCodec::key_stride() const {
  return PackedBytes(n(), values_.bits);
}

absl::Status KiviCodec::EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                                    uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                                    CodecStats* stats) const {
  if (count < 1 || count > block_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block of ", count, " tokens out of range [1, ", block_tokens(), "]"));
  }
  const int n = this->n();
  absl::Status st = CheckInput(keys, count, n, true, "key");
  if (st.ok()) st = CheckInput(values, count, n, true, "value");
  if (!st.ok()) return st;
  const int levels = 1 << values_.bits;
  // Per-channel grids over the block's tokens.
  std::vector<HalfGrid> grids(n);
  for (int j = 0; j < n; ++j) {
    float lo = keys[j], hi = keys[j];
    for (int t = 1; t < count; ++t) {
      lo = std::min(lo, keys[static_cast<size_t>(t) * n + j]);
      hi = std::max(hi, keys[static_cast<size_t>(t) * n + j]);
    }
    grids[j] = HalfGrid::FromRange(lo, hi, levels);
    grids[j].Store(side + 4 * j);
  }
  scratch->symbols.resize(n);
  uint8_t* codes = scratch->symbols.data();
  for (int t = 0; t < count; ++t) {
    const float* k = keys + static_cast<size_t>(t) * n;
    for (int j = 0; j < n; ++j) codes[j] = grids[j].Quantize(k[j]);
    PackBits(codes, n, values_.bits, key_records + t * key_stride());
    EncodeGroups(values_, values + static_cast<size_t>(t) * n, value_records + t * value_stride(), codes,
                 &scratch->rows);
  }
  if (stats != nullptr) {
    stats->keys.streams += count;
    stats->keys.symbols += static_cast<int64_t>(count) * n;
    stats->keys.bytes_used += static_cast<int64_t>(count) * key_stride() + side_stride();
    stats->keys.bytes_budget += static_cast<int64_t>(count) * key_stride() + side_stride();
    stats->values.streams += count;
    stats->values.symbols += static_cast<int64_t>(count) * n;
    stats->values.bytes_used += static_cast<int64_t>(count) * value_stride();
    stats->values.bytes_budget += static_cast<int64_t>(count) * value_stride();
  }
  return absl::OkStatus();
}

absl::Status KiviCodec::DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side,
                                    int count, float* keys, float* values, CodecScratch* scratch) const {
  const int n = this->n();
  const int levels = 1 << values_.bits;
  absl::Status result;
  std::vector<HalfGrid> grids(n);
  for (int j = 0; j < n; ++j) result.Update(HalfGrid::Load(side + 4 * j, levels, &grids[j]));
  scratch->symbols.resize(n);
  uint8_t* codes = scratch->symbols.data();
  for (int t = 0; t < count; ++t) {
    float* k = keys + static_cast<size_t>(t) * n;
    UnpackBits(key_records + t * key_stride(), n, values_.bits, codes);
    for (int j = 0; j < n; ++j) k[j] = grids[j].Dequantize(codes[j]);
    result.Update(
        DecodeGroups(values_, value_records + t * value_stride(), values + static_cast<size_t>(t) * n, codes));
  }
  return result;
}

}  // namespace baselines
}  // namespace driftkv
