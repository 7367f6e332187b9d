#include "eval/sweep_points.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "codec/stream_codec.h"

namespace driftkv {
namespace {

// The defaults' split of a mean budget b: keys 2.69 and values 1.84 bits
// per value at b = 2.265 (paper, n = 1024).
constexpr double kKeyShare = 2.69 / 2.265;
constexpr double kValueShare = 1.84 / 2.265;
// log2 of the defaults' levels minus their bits: log2 8 - 2.69, log2 6 - 1.84.
constexpr double kKeyLevelHeadroom = 0.31;
constexpr double kValueLevelHeadroom = 0.74;

int Levels(double bits, double headroom) {
  return std::clamp(static_cast<int>(std::lround(std::pow(2.0, bits + headroom))), 3, 16);
}

// The largest payload whose record stride (header and padding included) is
// at most `bytes` per token.
int PayloadFor(double bytes) {
  const int stride = static_cast<int>(std::floor(bytes / kRecordAlign)) * kRecordAlign;
  return std::max(1, stride - kRecordHeaderBytes);
}

CodecOptions Base(const std::string& name, int h, int d) {
  CodecOptions o;
  o.name = name;
  o.kv_heads = h;
  o.head_dim = d;
  return o;
}

std::vector<SweepPoint> DQuantPoints(int h, int d) {
  std::vector<SweepPoint> points;
  SweepPoint def{Base("dquant", h, d), "defaults", "default"};
  def.config = absl::StrFormat("defaults levels %d/%d", def.options.key_levels, def.options.value_levels);
  points.push_back(def);
  const double n = static_cast<double>(h) * d;
  CodecOptions probe = Base("dquant", h, d);
  const int mean_stride = (h * d + kMeanHeaderBytes + 3) / 4 * 4;  // dquant_codec.h
  const double mean_bytes = static_cast<double>(mean_stride) / probe.mean_window;
  for (double b : {1.5, 1.75, 1.96, 2.5, 2.75, 3.0, 3.5, 4.0}) {
    SweepPoint p{Base("dquant", h, d), "", b == 1.96 ? "b1.96" : ""};
    const double kb = kKeyShare * b, vb = kValueShare * b;
    p.options.key_levels = Levels(kb, kKeyLevelHeadroom);
    p.options.value_levels = Levels(vb, kValueLevelHeadroom);
    p.options.key_bytes = PayloadFor(kb * n / 8 - mean_bytes);
    p.options.value_bytes = PayloadFor(vb * n / 8);
    p.config = absl::StrFormat("target %.2f bytes %d/%d levels %d/%d", b, p.options.key_bytes, p.options.value_bytes,
                               p.options.key_levels, p.options.value_levels);
    points.push_back(p);
  }
  return points;
}

// Largest fixed levels per tensor whose storage fits in `dq`'s.
absl::StatusOr<SweepPoint> MatchedFixed(const SweepPoint& dq, int h, int d) {
  absl::StatusOr<std::unique_ptr<KvCodec>> ref = MakeKvCodec(dq.options);
  if (!ref.ok()) return ref.status();
  int best_k = 0, best_v = 0;
  for (int m = 2; m <= 64; ++m) {
    CodecOptions o = Base("fixed", h, d);
    o.key_levels = o.value_levels = m;
    absl::StatusOr<std::unique_ptr<KvCodec>> c = MakeKvCodec(o);
    if (!c.ok()) return c.status();
    if ((*c)->key_bits_per_value() <= (*ref)->key_bits_per_value() + 1e-12) best_k = m;
    if ((*c)->value_bits_per_value() <= (*ref)->value_bits_per_value() + 1e-12) best_v = m;
  }
  if (best_k < 2 || best_v < 2) {
    return absl::InvalidArgumentError(absl::StrCat("no fixed configuration fits ", dq.config));
  }
  SweepPoint p{Base("fixed", h, d), "", absl::StrCat("matched-", dq.tag.empty() ? "grid" : dq.tag)};
  p.options.key_levels = best_k;
  p.options.value_levels = best_v;
  p.config = absl::StrFormat("levels %d/%d matching dquant %s", best_k, best_v, dq.config);
  return p;
}

std::vector<SweepPoint> FixedGrid(int h, int d) {
  std::vector<SweepPoint> points;
  for (auto [k, v] :
       std::vector<std::pair<int, int>>{{3, 2}, {4, 3}, {5, 3}, {6, 4}, {7, 5}, {8, 6}, {10, 7}, {12, 9}, {16, 12}}) {
    SweepPoint p{Base("fixed", h, d), absl::StrFormat("levels %d/%d", k, v), ""};
    p.options.key_levels = k;
    p.options.value_levels = v;
    points.push_back(p);
  }
  return points;
}

SweepPoint IntLike(const std::string& name, int h, int d, int bits, int group) {
  SweepPoint p{Base(name, h, d), absl::StrFormat("bits %d group %d", bits, group),
               bits == 2 && group == 128 ? "default" : ""};
  p.options.bits = bits;
  p.options.group = group;
  return p;
}

}  // namespace

absl::StatusOr<std::vector<SweepPoint>> SweepPoints(const std::vector<std::string>& codecs, int h, int d) {
  std::vector<SweepPoint> points;
  for (const std::string& name : codecs) {
    if (name == "dquant") {
      for (const SweepPoint& p : DQuantPoints(h, d)) points.push_back(p);
    } else if (name == "fixed") {
      for (const SweepPoint& dq : DQuantPoints(h, d)) {
        absl::StatusOr<SweepPoint> m = MatchedFixed(dq, h, d);
        if (m.ok()) points.push_back(*m);  // a dquant point that fails is skipped there too
      }
      for (const SweepPoint& p : FixedGrid(h, d)) points.push_back(p);
    } else if (name == "int") {
      for (int g : {512, 256, 128, 64, 32}) points.push_back(IntLike("int", h, d, 2, g));
      for (int b : {3, 4}) points.push_back(IntLike("int", h, d, b, 128));
    } else if (name == "kivi" || name == "oscar") {
      for (int b : {2, 3, 4}) points.push_back(IntLike(name, h, d, b, 128));
      if (name == "oscar") points.push_back(IntLike(name, h, d, 2, 512));
    } else if (name == "turbo") {
      for (int b : {1, 2, 3, 4}) points.push_back(IntLike("turbo", h, d, b, 128));
    } else if (name == "fp8" || name == "bf16") {
      points.push_back(SweepPoint{Base(name, h, d), "-", "default"});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("sweep: unknown codec \"", name, "\"; known: ", absl::StrJoin(KvCodecNames(), ", ")));
    }
  }
  // Groups larger than n (small shapes) would be rejected; drop them here.
  const int n = h * d;
  points.erase(std::remove_if(points.begin(), points.end(),
                              [n](const SweepPoint& p) {
                                return p.options.name != "dquant" && p.options.name != "fixed" &&
                                       (p.options.group > n || n % p.options.group != 0);
                              }),
               points.end());
  return points;
}

}  // namespace driftkv
