#include "codec/baselines/fixed_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/baselines/base_m.h"
#include "codec/baselines/common.h"
#include "codec/dquant_codec.h"
#include "codec/hadamard.h"
#include "wire/half.h"

namespace driftkv {
namespace baselines {
namespace {

int Nearest(float u, int levels) {
  return static_cast<int>(std::clamp(std::nearbyint(u), 0.0f, static_cast<float>(levels - 1)));
}

// The INT8 window mean exactly as dquant_codec.cc stores it:
// [0:4) fp32 scale, [4:4+n) int8, zero padding. Writes the dequantised mean.
void EncodeMean(const float* rows, int count, int n, size_t stride, uint8_t* record, float* mu) {
  std::vector<double> mean(n, 0.0);
  for (int t = 0; t < count; ++t) {
    for (int j = 0; j < n; ++j) mean[j] += rows[static_cast<size_t>(t) * n + j];
  }
  double max_abs = 0.0;
  for (int j = 0; j < n; ++j) {
    mean[j] /= count;
    max_abs = std::max(max_abs, std::fabs(mean[j]));
  }
  const float scale = static_cast<float>(max_abs / 127.0);
  std::memset(record, 0, stride);
  StoreF32(record, scale);
  int8_t* q = reinterpret_cast<int8_t*>(record + kMeanHeaderBytes);
  for (int j = 0; j < n; ++j) {
    const long r = scale > 0.0f ? std::lround(mean[j] / scale) : 0;
    q[j] = static_cast<int8_t>(std::clamp<long>(r, -127, 127));
    mu[j] = static_cast<float>(q[j]) * scale;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCodec>> FixedCodec::Create(int kv_heads, int head_dim, int key_levels,
                                                            int value_levels, int mean_window) {
  if (kv_heads < 1 || kv_heads > 1024 || !IsPowerOfTwo(head_dim) || head_dim > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed: shape ", kv_heads, " x ", head_dim,
                     " needs 1 <= kv_heads <= 1024 and a power-of-two head_dim <= 4096 (Hadamard)"));
  }
  for (int m : {key_levels, value_levels}) {
    if (m < kMinBaseM || m > kMaxBaseM) {
      return absl::InvalidArgumentError(absl::StrCat("fixed: levels ", m, " out of range [2, 256]"));
    }
  }
  if (mean_window < 1 || mean_window > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat("fixed: mean_window ", mean_window, " out of range [1, 65536]"));
  }
  return std::unique_ptr<KvCodec>(new FixedCodec(kv_heads, head_dim, key_levels, value_levels, mean_window));
}

FixedCodec::FixedCodec(int kv_heads, int head_dim, int key_levels, int value_levels, int mean_window)
    : kv_heads_(kv_heads),
      head_dim_(head_dim),
      key_levels_(key_levels),
      value_levels_(value_levels),
      mean_window_(mean_window),
      key_bytes_(BaseMBytes(kv_heads * head_dim, key_levels)),
      value_bytes_(BaseMBytes(kv_heads * head_dim, value_levels)) {}

size_t FixedCodec::side_stride() const {
  return (static_cast<size_t>(n()) + kMeanHeaderBytes + 3) / 4 * 4;
}

void FixedCodec::EncodeStream(const float* x, int levels, size_t bytes, uint8_t* record, CodecScratch* scratch,
                              StreamStats* stats) const {
  const int n = this->n();
  scratch->symbols.resize(n);
  uint8_t* m = scratch->symbols.data();
  const auto mm = std::minmax_element(x, x + n);
  const float lo = *mm.first, hi = *mm.second;
  float scale = 0.0f, offset = RoundToHalf(lo);
  int64_t moved = 0;
  if (hi > lo) {
    const double s0 = (static_cast<double>(hi) - lo) / (levels - 1);
    double sm = 0, smm = 0, sx = 0, sxm = 0;
    for (int i = 0; i < n; ++i) {
      m[i] = static_cast<uint8_t>(Nearest(static_cast<float>((x[i] - lo) / s0), levels));
      sm += m[i];
      smm += static_cast<double>(m[i]) * m[i];
      sx += x[i];
      sxm += static_cast<double>(x[i]) * m[i];
    }
    const double det = n * smm - sm * sm;
    double s = s0, o = lo;
    if (det > 0.0) {
      s = (n * sxm - sm * sx) / det;
      o = (sx - s * sm) / n;
    }
    if (!(s > 0.0) || !std::isfinite(s) || !std::isfinite(o)) {
      s = s0;
      o = lo;
    }
    scale = RoundToHalf(static_cast<float>(std::min<double>(s, kHalfMax)));
    offset = RoundToHalf(static_cast<float>(std::clamp<double>(o, -kHalfMax, kHalfMax)));
    if (scale > 0.0f) {
      for (int i = 0; i < n; ++i) {
        const uint8_t before = m[i];
        m[i] = static_cast<uint8_t>(Nearest((x[i] - offset) / scale, levels));
        moved += m[i] != before;
      }
    }
  }
  if (!(scale > 0.0f)) {
    scale = 0.0f;
    std::memset(m, 0, n);
  }
  StoreU16(record, FloatToHalf(scale));
  StoreU16(record + 2, FloatToHalf(offset));
  std::vector<uint32_t> limbs;
  PackBaseM(m, n, levels, bytes, record + 4, &limbs);
  if (stats != nullptr) {
    ++stats->streams;
    stats->symbols += n;
    stats->bytes_used += 4 + bytes;
    stats->bytes_budget += 4 + bytes;
    stats->moved += moved;  // symbols changed by the refit, not by drift
    stats->constant += scale == 0.0f;
  }
}

absl::Status FixedCodec::DecodeStream(const uint8_t* record, int levels, size_t bytes, float* x,
                                      CodecScratch* scratch) const {
  const int n = this->n();
  scratch->symbols.resize(n);
  uint8_t* m = scratch->symbols.data();
  HalfGrid grid;
  absl::Status st = HalfGrid::Load(record, levels, &grid);
  std::vector<uint32_t> limbs;
  st.Update(UnpackBaseM(record + 4, bytes, n, levels, m, &limbs));
  for (int i = 0; i < n; ++i) x[i] = grid.Dequantize(m[i]);
  return st;
}

absl::Status FixedCodec::EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                                     uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                                     CodecStats* stats) const {
  if (count < 1 || count > mean_window_) {
    return absl::InvalidArgumentError(
        absl::StrCat("window of ", count, " tokens out of range [1, ", mean_window_, "]"));
  }
  const int n = this->n();
  absl::Status st = CheckInput(keys, count, n, true, "key");
  if (st.ok()) st = CheckInput(values, count, n, true, "value");
  if (!st.ok()) return st;
  std::vector<float> rows(keys, keys + static_cast<size_t>(count) * n);
  for (int t = 0; t < count; ++t) HadamardHeads(&rows[static_cast<size_t>(t) * n], kv_heads_, head_dim_);
  std::vector<float> mu(n), row(n);
  EncodeMean(rows.data(), count, n, side_stride(), side, mu.data());
  CodecStats local;
  for (int t = 0; t < count; ++t) {
    const float* r = &rows[static_cast<size_t>(t) * n];
    for (int j = 0; j < n; ++j) row[j] = r[j] - mu[j];
    EncodeStream(row.data(), key_levels_, key_bytes_, key_records + t * key_stride(), scratch, &local.keys);
    std::memcpy(row.data(), values + static_cast<size_t>(t) * n, sizeof(float) * n);
    HadamardHeads(row.data(), kv_heads_, head_dim_);
    EncodeStream(row.data(), value_levels_, value_bytes_, value_records + t * value_stride(), scratch, &local.values);
  }
  if (stats != nullptr) stats->Add(local);
  return absl::OkStatus();
}

absl::Status FixedCodec::DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side,
                                     int count, float* keys, float* values, CodecScratch* scratch) const {
  const int n = this->n();
  std::vector<float> mu(n);
  DQuantCodec::LoadMean(side, n, mu.data());
  absl::Status result;
  for (int t = 0; t < count; ++t) {
    float* k = keys + static_cast<size_t>(t) * n;
    result.Update(DecodeStream(key_records + t * key_stride(), key_levels_, key_bytes_, k, scratch));
    for (int j = 0; j < n; ++j) k[j] += mu[j];
    HadamardHeads(k, kv_heads_, head_dim_);
    float* v = values + static_cast<size_t>(t) * n;
    result.Update(DecodeStream(value_records + t * value_stride(), value_levels_, value_bytes_, v, scratch));
    HadamardHeads(v, kv_heads_, head_dim_);
  }
  return result;
}

}  // namespace baselines
}  // namespace driftkv
