#include "codec/dquant_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/hadamard.h"
#include "codec/prob_model.h"

namespace driftkv {
namespace {

constexpr int kMaxHeadDim = 4096;
constexpr int kMaxStream = 1 << 16;
constexpr int kMaxMeanWindow = 1 << 16;

void StoreF32(uint8_t* p, float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}

float LoadF32(const uint8_t* p) {
  const uint32_t u = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

absl::Status CheckFinite(const float* x, int count, int n, const char* what) {
  for (int64_t i = 0; i < static_cast<int64_t>(count) * n; ++i) {
    if (!std::isfinite(x[i])) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of token ", i / n, " channel ", i % n, " is ", x[i],
                                                     "; only finite values can be coded"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StreamCodec> MakeStreamCodec(int n, int levels, int bytes, int reference, double alpha) {
  uint16_t freq[kMaxLevels];
  absl::Status st = ModelFrequencies(n, levels, alpha, freq);
  if (!st.ok()) return st;
  if (bytes == 0) bytes = DefaultPayloadBytes(n, reference, levels, alpha);
  return StreamCodec::Create(n, levels, bytes, freq);
}

// The payload bytes whose CodedBitsPerValue is at least `bits`.
int BytesForCodedBits(double bits, int n) {
  return static_cast<int>(std::ceil((bits * n + kStateBits) / 8.0));
}

}  // namespace

int DefaultPayloadBytes(int n, int reference_bytes, int levels, double alpha) {
  if (n >= kCodedBitsRuleBelow) return LegacyDefaultPayloadBytes(n, reference_bytes, levels, alpha);
  // CodedBitsPerValue(C, n) >= CodedBitsPerValue(R, 1024), in integers:
  // 8 C - 32 >= (8 R - 32) n / 1024, so C = ceil(((8 R - 32) n + 32768) / 8192).
  const int64_t coded_bits = 8 * static_cast<int64_t>(reference_bytes) - kStateBits;  // 2616 or 1816
  const int64_t scale = 8 * static_cast<int64_t>(kReferenceStreamLength);
  int64_t bytes = (coded_bits * n + kStateBits * kReferenceStreamLength + scale - 1) / scale;
  uint16_t freq[kMaxLevels];
  if (ModelFrequencies(n, levels, alpha, freq).ok()) {
    absl::StatusOr<int> min_bytes = StreamCodec::MinPayloadBytes(n, levels, freq);
    if (min_bytes.ok()) bytes = std::max<int64_t>(bytes, *min_bytes);
  }
  // The stride's alignment bytes: RecordStride(C) - 4 is C rounded up to a
  // multiple of 4, since the header is 4 bytes.
  static_assert(kRecordHeaderBytes % kRecordAlign == 0, "C + header is aligned when C is");
  return static_cast<int>((bytes + kRecordAlign - 1) / kRecordAlign * kRecordAlign);
}

int LegacyDefaultPayloadBytes(int n, int reference_bytes, int levels, double alpha) {
  // Keep the reference's stored bits per value: the record stride is the
  // reference stride's share for n, rounded to the nearest multiple of 4
  // (ties up), and the payload may not exceed its share of the reference
  // payload. At n = 1024 this is the reference itself.
  const int64_t by_payload =
      (2 * static_cast<int64_t>(reference_bytes) * n + kReferenceStreamLength) / (2 * kReferenceStreamLength);
  const int64_t share = static_cast<int64_t>(RecordStride(reference_bytes)) * n;  // x 1/1024
  const int64_t stride =
      (share + kReferenceStreamLength * kRecordAlign / 2) / (kReferenceStreamLength * kRecordAlign) * kRecordAlign;
  const int scaled = static_cast<int>(std::max<int64_t>(0, std::min(by_payload, stride - kRecordHeaderBytes)));
  uint16_t freq[kMaxLevels];
  if (!ModelFrequencies(n, levels, alpha, freq).ok()) return scaled;
  absl::StatusOr<int> min_bytes = StreamCodec::MinPayloadBytes(n, levels, freq);
  return min_bytes.ok() ? std::max(scaled, *min_bytes) : scaled;
}

double CodedBitsPerValue(int payload_bytes, int n) {
  return (8.0 * payload_bytes - kStateBits) / n;
}

std::string QualityEnvelopeWarning(const DQuantCodec& codec) {
  const int n = codec.n();
  const double key = CodedBitsPerValue(codec.config().key_bytes, n);
  const double value = CodedBitsPerValue(codec.config().value_bytes, n);
  const double key_ref = CodedBitsPerValue(kReferenceKeyBytes, kReferenceStreamLength);
  const double value_ref = CodedBitsPerValue(kReferenceValueBytes, kReferenceStreamLength);
  if (key >= kQualityEnvelopeShare * key_ref && value >= kQualityEnvelopeShare * value_ref) return "";
  const DQuantConfig& c = codec.config();
  return absl::StrFormat(
      "kv_heads x head_dim = %d with key_bytes/value_bytes %d/%d is outside D-Quant's quality envelope: a "
      "record's 8 fixed bytes (grid, rANS state) leave %.2f/%.2f coded bits per key/value against %.2f/%.2f at "
      "n = 1024, so expect a larger NMSE and attention error (docs/quality.md \"Small shapes\"); "
      "codec.key_bytes/value_bytes of at least %d/%d code the reference's bits (unset, they resolve to %d/%d)",
      n, c.key_bytes, c.value_bytes, key, value, key_ref, value_ref, BytesForCodedBits(key_ref, n),
      BytesForCodedBits(value_ref, n), DefaultPayloadBytes(n, kReferenceKeyBytes, c.key_levels, c.alpha),
      DefaultPayloadBytes(n, kReferenceValueBytes, c.value_levels, c.alpha));
}

absl::Status DQuantConfig::Validate() const {
  if (kv_heads < 1 || kv_heads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("kv_heads ", kv_heads, " out of range [1, 1024]"));
  }
  if (head_dim < 1 || head_dim > kMaxHeadDim || (hadamard && !IsPowerOfTwo(head_dim))) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", head_dim, " must be a power of two in [1, ",
                                                   kMaxHeadDim, "] (the Hadamard rotation needs it)"));
  }
  if (n() > kMaxStream) {
    return absl::InvalidArgumentError(absl::StrCat("kv_heads * head_dim = ", n(), " exceeds ", kMaxStream));
  }
  if (key_levels < kMinLevels || key_levels > kMaxLevels) {
    return absl::InvalidArgumentError(absl::StrCat("key_levels ", key_levels, " out of range [2, 16]"));
  }
  if (value_levels < kMinLevels || value_levels > kMaxLevels) {
    return absl::InvalidArgumentError(absl::StrCat("value_levels ", value_levels, " out of range [2, 16]"));
  }
  if (key_bytes < 0) return absl::InvalidArgumentError(absl::StrCat("key_bytes ", key_bytes, " is negative"));
  if (value_bytes < 0) return absl::InvalidArgumentError(absl::StrCat("value_bytes ", value_bytes, " is negative"));
  if (!(alpha > 0.0 && alpha <= 16.0)) {
    return absl::InvalidArgumentError(absl::StrCat("alpha ", alpha, " out of range (0, 16]"));
  }
  if (mean_window < 1 || mean_window > kMaxMeanWindow) {
    return absl::InvalidArgumentError(
        absl::StrCat("mean_window ", mean_window, " out of range [1, ", kMaxMeanWindow, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DQuantCodec> DQuantCodec::Create(const DQuantConfig& config) {
  absl::Status st = config.Validate();
  if (!st.ok()) return st;
  const int n = config.n();
  absl::StatusOr<StreamCodec> k =
      MakeStreamCodec(n, config.key_levels, config.key_bytes, kReferenceKeyBytes, config.alpha);
  if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("keys: ", k.status().message()));
  absl::StatusOr<StreamCodec> v =
      MakeStreamCodec(n, config.value_levels, config.value_bytes, kReferenceValueBytes, config.alpha);
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("values: ", v.status().message()));
  v->set_refit(config.value_refit);
  DQuantConfig resolved = config;
  resolved.key_bytes = k->payload_bytes();
  resolved.value_bytes = v->payload_bytes();
  return DQuantCodec(resolved, *std::move(k), *std::move(v));
}

size_t DQuantCodec::mean_stride() const {
  return (static_cast<size_t>(n()) + kMeanHeaderBytes + 3) / 4 * 4;
}

PageLayout DQuantCodec::page_layout() const {
  return MakePageLayout(config_.mean_window, config_.kv_heads, config_.head_dim, static_cast<int>(key_stride()),
                        static_cast<int>(value_stride()), static_cast<int>(mean_stride()));
}

double DQuantCodec::key_bits_per_value() const {
  return 8.0 * (key_stride() + static_cast<double>(mean_stride()) / config_.mean_window) / n();
}

double DQuantCodec::value_bits_per_value() const {
  return 8.0 * value_stride() / n();
}

void DQuantCodec::LoadMean(const uint8_t* mean_record, int n, float* mu) {
  const float scale = LoadF32(mean_record);
  const int8_t* q = reinterpret_cast<const int8_t*>(mean_record + kMeanHeaderBytes);
  for (int j = 0; j < n; ++j) mu[j] = static_cast<float>(q[j]) * scale;
}

absl::Status DQuantCodec::EncodeWindow(const float* keys, const float* values, int count, uint8_t* key_records,
                                       uint8_t* value_records, uint8_t* mean_record, CodecScratch* scratch,
                                       StreamStats* key_stats, StreamStats* value_stats, StreamStats* key_each,
                                       StreamStats* value_each, uint8_t* key_symbols, uint8_t* value_symbols) const {
  const int n = this->n();
  const int heads = config_.kv_heads;
  if (count < 1 || count > config_.mean_window) {
    return absl::InvalidArgumentError(
        absl::StrCat("window of ", count, " tokens out of range [1, ", config_.mean_window, "]"));
  }
  absl::Status st = CheckFinite(keys, count, n, "key");
  if (st.ok()) st = CheckFinite(values, count, n, "value");
  if (!st.ok()) return st;

  // Rotate the window's keys and take their channel mean.
  scratch->rows.resize(static_cast<size_t>(count) * n);
  scratch->row.resize(n);
  float* rows = scratch->rows.data();
  std::memcpy(rows, keys, sizeof(float) * count * n);
  for (int t = 0; t < count; ++t) Rotate(rows + static_cast<size_t>(t) * n, heads);
  std::vector<double> mean(n, 0.0);
  for (int t = 0; t < count; ++t) {
    const float* r = rows + static_cast<size_t>(t) * n;
    for (int j = 0; j < n; ++j) mean[j] += r[j];
  }
  double max_abs = 0.0;
  for (int j = 0; j < n; ++j) {
    mean[j] /= count;
    max_abs = std::max(max_abs, std::fabs(mean[j]));
  }
  const float scale = static_cast<float>(max_abs / 127.0);
  std::memset(mean_record, 0, mean_stride());
  StoreF32(mean_record, scale);
  int8_t* q = reinterpret_cast<int8_t*>(mean_record + kMeanHeaderBytes);
  std::vector<float> mu(n, 0.0f);
  for (int j = 0; j < n; ++j) {
    const long r = scale > 0.0f ? std::lround(mean[j] / scale) : 0;
    q[j] = static_cast<int8_t>(std::clamp<long>(r, -127, 127));
    mu[j] = static_cast<float>(q[j]) * scale;
  }

  float* row = scratch->row.data();
  for (int t = 0; t < count; ++t) {
    const float* r = rows + static_cast<size_t>(t) * n;
    for (int j = 0; j < n; ++j) row[j] = r[j] - mu[j];
    StreamStats one;
    st = keys_.Encode(row, key_records + t * key_stride(), &scratch->stream, &one);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("key of token ", t, ": ", st.message()));
    if (key_stats != nullptr) key_stats->Add(one);
    if (key_each != nullptr) key_each[t] = one;
    if (key_symbols != nullptr) {
      std::memcpy(key_symbols + static_cast<size_t>(t) * n, scratch->stream.symbols.data(), n);
    }
  }
  for (int t = 0; t < count; ++t) {
    std::memcpy(row, values + static_cast<size_t>(t) * n, sizeof(float) * n);
    Rotate(row, heads);
    StreamStats one;
    st = values_.Encode(row, value_records + t * value_stride(), &scratch->stream, &one);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("value of token ", t, ": ", st.message()));
    if (value_stats != nullptr) value_stats->Add(one);
    if (value_each != nullptr) value_each[t] = one;
    if (value_symbols != nullptr) {
      std::memcpy(value_symbols + static_cast<size_t>(t) * n, scratch->stream.symbols.data(), n);
    }
  }
  return absl::OkStatus();
}

absl::Status DQuantCodec::DecodeKey(const uint8_t* record, const uint8_t* mean_record, float* out,
                                    CodecScratch* scratch) const {
  const int n = this->n();
  scratch->symbols.resize(n);
  float s, o;
  absl::Status st = keys_.DecodeSymbols(record, scratch->symbols.data(), &s, &o);
  KeyFromSymbols(scratch->symbols.data(), s, o, mean_record, out, scratch);
  return st;
}

void DQuantCodec::KeyFromSymbols(const uint8_t* symbols, float s, float o, const uint8_t* mean_record, float* out,
                                 CodecScratch* scratch) const {
  const int n = this->n();
  scratch->row.resize(n);
  LoadMean(mean_record, n, scratch->row.data());
  for (int j = 0; j < n; ++j) out[j] = o + s * static_cast<float>(symbols[j]) + scratch->row[j];
  Rotate(out, config_.kv_heads);
}

absl::Status DQuantCodec::DecodeValue(const uint8_t* record, float* out, CodecScratch* scratch) const {
  const int n = this->n();
  scratch->symbols.resize(n);
  float s, o;
  absl::Status st = values_.DecodeSymbols(record, scratch->symbols.data(), &s, &o);
  ValueFromSymbols(scratch->symbols.data(), s, o, out);
  return st;
}

void DQuantCodec::ValueFromSymbols(const uint8_t* symbols, float s, float o, float* out) const {
  const int n = this->n();
  for (int j = 0; j < n; ++j) out[j] = o + s * static_cast<float>(symbols[j]);
  Rotate(out, config_.kv_heads);
}

}  // namespace driftkv
