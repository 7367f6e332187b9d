#include "codec/stream_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/drift.h"
#include "codec/final_grid.h"
#include "wire/half.h"

namespace driftkv {
namespace {

uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

void Resize(StreamScratch* s, int n) {
  if (static_cast<int>(s->u.size()) < n) {
    s->u.resize(n);
    s->symbols.resize(n);
    s->nearest.resize(n);
    s->rans.resize(n + kStateBytes);
  }
}

// Step 6: the grid of `mode` for the final symbols, rounded to fp16 as step
// 3 rounds; leaves scale/offset alone when FinalGrid keeps the step-3 grid.
void RefitToSymbols(int mode, const float* x, const uint8_t* symbols, int n, float* scale, float* offset) {
  if (mode == kRefitLeastSquares) return;
  double sm = 0, smm = 0, sx = 0, sxx = 0, sxm = 0;
  for (int i = 0; i < n; ++i) {
    const double m = symbols[i], v = x[i];
    sm += m;
    smm += MulRn(m, m);
    sx += v;
    sxx += MulRn(v, v);
    sxm += MulRn(v, m);
  }
  double s, o;
  if (!FinalGrid(mode, n, sm, smm, sx, sxx, sxm, &s, &o)) return;
  const float hs = RoundToHalf(static_cast<float>(s));
  if (!(hs > 0.0f)) return;
  *scale = hs;
  *offset = RoundToHalf(static_cast<float>(o));
}

}  // namespace

const char* RefitName(Refit r) {
  switch (r) {
    case Refit::kUnbiased: return "unbiased";
    case Refit::kNormPreserving: return "norm";
    case Refit::kLeastSquares: break;
  }
  return "least_squares";
}

absl::StatusOr<Refit> ParseRefit(const std::string& name) {
  for (Refit r : {Refit::kLeastSquares, Refit::kUnbiased, Refit::kNormPreserving}) {
    if (name == RefitName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat("refit \"", name, "\" unknown; use least_squares, unbiased or norm"));
}

void StreamStats::Add(const StreamStats& o) {
  streams += o.streams;
  symbols += o.symbols;
  bytes_used += o.bytes_used;
  bytes_budget += o.bytes_budget;
  moved += o.moved;
  max_move = std::max(max_move, o.max_move);
  retries += o.retries;
  fallbacks += o.fallbacks;
  constant += o.constant;
}

absl::StatusOr<int> StreamCodec::MinPayloadBytes(int n, int levels, const uint16_t* freq) {
  RansTable table;
  absl::Status st = BuildRansTable(freq, levels, &table);
  if (!st.ok()) return st;
  int cheapest = 0;
  for (int m = 1; m < levels; ++m) {
    if (table.freq[m] > table.freq[cheapest]) cheapest = m;
  }
  std::vector<uint8_t> symbols(n, static_cast<uint8_t>(cheapest));
  std::vector<uint8_t> scratch(n + kStateBytes), payload(n + kStateBytes);
  return static_cast<int>(RansEncode(symbols.data(), n, table, payload.data(), payload.size(), scratch.data()));
}

absl::StatusOr<StreamCodec> StreamCodec::Create(int n, int levels, int payload_bytes, const uint16_t* freq) {
  if (n < 1 || n > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("stream length ", n, " out of range [1, 1048576]"));
  }
  StreamCodec codec;
  absl::Status st = BuildRansTable(freq, levels, &codec.table_);
  if (!st.ok()) return st;
  absl::StatusOr<int> min_bytes = MinPayloadBytes(n, levels, freq);
  if (!min_bytes.ok()) return min_bytes.status();
  if (payload_bytes < *min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("container of ", payload_bytes, " bytes is too small for ", n,
                                                   " values at ", levels, " levels: even the all-central stream needs ",
                                                   *min_bytes, " bytes"));
  }
  if (payload_bytes > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("container of ", payload_bytes, " bytes is too large"));
  }
  codec.n_ = n;
  codec.payload_bytes_ = payload_bytes;
  for (int m = 1; m < levels; ++m) {
    if (codec.table_.freq[m] > codec.table_.freq[codec.cheapest_]) codec.cheapest_ = m;
  }
  return codec;
}

size_t StreamCodec::EncodeFitting(const float* u, float scale, uint8_t* payload, StreamScratch* scratch,
                                  StreamStats* stats) const {
  const int n = n_;
  const int levels = table_.levels;
  uint8_t* symbols = scratch->symbols.data();
  const size_t capacity = static_cast<size_t>(payload_bytes_);
  if (scale > 0.0f) {
    double budget = 8.0 * payload_bytes_ - kStateBits;
    for (int attempt = 0; attempt < kMaxRetries; ++attempt) {
      const DriftResult r = Drift(u, n, table_.cost_bits, levels, budget, symbols);
      const size_t used = RansEncode(symbols, n, table_, payload, capacity, scratch->rans.data());
      if (used <= capacity) return used;
      ++stats->retries;
      // The real stream was longer than its ideal cost by (8 used - cost);
      // ask for that much less, plus a margin that doubles each time.
      const double excess = 8.0 * static_cast<double>(used - capacity);
      budget = std::min(budget - 1.0, r.cost_bits - excess - static_cast<double>(1 << attempt));
    }
    ++stats->fallbacks;
    const Assignment cheap = CheapestLevels(table_.cost_bits, levels);
    for (int i = 0; i < n; ++i) symbols[i] = static_cast<uint8_t>(cheap.Assign(u[i]));
    const size_t used = RansEncode(symbols, n, table_, payload, capacity, scratch->rans.data());
    if (used <= capacity) return used;
  }
  // Constant stream, or the last resort: one symbol everywhere, which
  // Create() verified fits.
  std::memset(symbols, cheapest_, n);
  return RansEncode(symbols, n, table_, payload, capacity, scratch->rans.data());
}

absl::Status StreamCodec::Encode(const float* x, uint8_t* record, StreamScratch* scratch, StreamStats* stats) const {
  const int n = n_;
  const int levels = table_.levels;
  float lo = x[0], hi = x[0];
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || std::fabs(x[i]) > kHalfMax) {
      return absl::InvalidArgumentError(absl::StrCat(
          "value ", x[i], " at stream position ", i,
          std::isfinite(x[i]) ? " exceeds the fp16 range of the container (|x| <= 65504)" : " is not finite"));
    }
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  Resize(scratch, n);
  float* u = scratch->u.data();
  uint8_t* symbols = scratch->symbols.data();
  StreamStats local;
  local.streams = 1;
  local.symbols = n;
  local.bytes_budget = payload_bytes_;

  float scale = 0.0f, offset = RoundToHalf(lo);
  if (hi > lo) {
    // 1-2. Min-max grid and a first drift on it.
    const float s0 = static_cast<float>((static_cast<double>(hi) - lo) / (levels - 1));
    for (int i = 0; i < n; ++i) u[i] = (x[i] - lo) / s0;
    Drift(u, n, table_.cost_bits, levels, 8.0 * payload_bytes_ - kStateBits, symbols);
    // 3. Least-squares refit of (s, o) to the symbols, then fp16.
    double sm = 0, smm = 0, sx = 0, sxm = 0;
    for (int i = 0; i < n; ++i) {
      const double m = symbols[i];
      sm += m;
      smm += m * m;
      sx += x[i];
      sxm += x[i] * m;
    }
    const double det = n * smm - sm * sm;
    double s = s0, o = lo;
    if (det > 0.0) {
      s = (n * sxm - sm * sx) / det;
      o = (sx - s * sm) / n;
    }
    if (std::isfinite(o) && std::fabs(o) > kHalfMax && smm > 0.0) {
      // The fit wants an origin fp16 cannot hold (a lone outlier drifted
      // towards the centre): pin o to the fp16 limit and refit s alone.
      o = std::clamp<double>(o, -kHalfMax, kHalfMax);
      s = (sxm - o * sm) / smm;
    }
    if (!(s > 0.0) || !std::isfinite(s) || !std::isfinite(o)) {
      s = s0;
      o = lo;
    }
    scale = RoundToHalf(static_cast<float>(std::min<double>(s, kHalfMax)));
    offset = RoundToHalf(static_cast<float>(std::clamp<double>(o, -kHalfMax, kHalfMax)));
  }
  uint8_t* payload = record + kRecordHeaderBytes;
  size_t used;
  if (scale > 0.0f) {
    // 4. Drift on the exact fp16 grid (inside EncodeFitting).
    for (int i = 0; i < n; ++i) u[i] = (x[i] - offset) / scale;
    used = EncodeFitting(u, scale, payload, scratch, &local);
    int max_move = 0;
    int64_t moved = 0;
    for (int i = 0; i < n; ++i) {
      const int d = std::abs(static_cast<int>(symbols[i]) - NearestLevel(u[i], levels));
      moved += d != 0;
      max_move = std::max(max_move, d);
    }
    local.moved = moved;
    local.max_move = max_move;
    RefitToSymbols(static_cast<int>(refit_), x, symbols, n, &scale, &offset);
  } else {
    // Constant (or fp16-underflowing) grid: every level decodes to `offset`.
    scale = 0.0f;
    local.constant = 1;
    used = EncodeFitting(u, 0.0f, payload, scratch, &local);
  }
  local.bytes_used = static_cast<int64_t>(used);
  StoreU16(record, FloatToHalf(scale));
  StoreU16(record + 2, FloatToHalf(offset));
  const size_t end = kRecordHeaderBytes + payload_bytes_;
  std::memset(record + end, 0, stride() - end);
  if (stats != nullptr) stats->Add(local);
  return absl::OkStatus();
}

absl::Status StreamCodec::DecodeSymbols(const uint8_t* record, uint8_t* symbols, float* scale, float* offset) const {
  *scale = HalfToFloat(LoadU16(record));
  *offset = HalfToFloat(LoadU16(record + 2));
  absl::Status st = RansDecode(record + kRecordHeaderBytes, payload_bytes_, n_, table_, symbols);
  if (st.ok() && (!std::isfinite(*scale) || !std::isfinite(*offset) || *scale < 0.0f)) {
    st = absl::DataLossError("record grid (scale/offset) is not finite");
  }
  // Symbols come from the table, so they are < levels even for corrupt data.
  return st;
}

absl::Status StreamCodec::DecodeSymbolsUpTo2(const uint8_t* records, int count, uint8_t* symbols, float* scale,
                                             float* offset) const {
  if (count != 2) return DecodeSymbols(records, symbols, scale, offset);
  const uint8_t* b = records + stride();
  absl::Status sa, sb;
  RansDecodePair(records + kRecordHeaderBytes, b + kRecordHeaderBytes, payload_bytes_, n_, table_, symbols,
                 symbols + n_, &sa, &sb);
  for (int k = 0; k < 2; ++k) {
    const uint8_t* r = records + k * stride();
    scale[k] = HalfToFloat(LoadU16(r));
    offset[k] = HalfToFloat(LoadU16(r + 2));
    if (!std::isfinite(scale[k]) || !std::isfinite(offset[k]) || scale[k] < 0.0f) {
      (k == 0 ? sa : sb).Update(absl::DataLossError("record grid (scale/offset) is not finite"));
    }
  }
  sa.Update(sb);
  return sa;
}

absl::Status StreamCodec::Decode(const uint8_t* record, float* x) const {
  std::vector<uint8_t> symbols(n_);
  float s, o;
  absl::Status st = DecodeSymbols(record, symbols.data(), &s, &o);
  for (int i = 0; i < n_; ++i) x[i] = o + s * static_cast<float>(symbols[i]);
  return st;
}

}  // namespace driftkv
