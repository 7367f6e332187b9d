// The default containers docs/api.md states ("Default containers") against
// what the server resolves (ResolveConfig, then the codec the handler
// makes): the documented formula, written out again here, for every
// power-of-two shape, and the page's table of resolved bytes row by row.
// Also the quality envelope: the defaults are inside it at every n, and
// the start-up warning for pinned containers outside it.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "codec/dquant_codec.h"
#include "codec/prob_model.h"
#include "gtest/gtest.h"
#include "service/config.h"

namespace driftkv {
namespace {

struct Resolved {
  int key_bytes = 0, value_bytes = 0;
  size_t key_stride = 0, value_stride = 0;
  std::string warning;
};

// key_bytes/value_bytes: the config's codec.key_bytes/value_bytes (0: unset).
Resolved Resolve(int kv_heads, int head_dim, int key_bytes = 0, int value_bytes = 0) {
  v1::ServerConfig c;
  c.mutable_model()->set_layers(1);
  c.mutable_model()->set_kv_heads(kv_heads);
  c.mutable_model()->set_head_dim(head_dim);
  if (key_bytes != 0) c.mutable_codec()->set_key_bytes(key_bytes);
  if (value_bytes != 0) c.mutable_codec()->set_value_bytes(value_bytes);
  c.set_pool_bytes(64 << 20);
  absl::StatusOr<ServiceOptions> o = ResolveConfig(c);
  EXPECT_TRUE(o.ok()) << o.status();
  if (!o.ok()) return {};
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(o->codec);
  EXPECT_TRUE(codec.ok()) << codec.status();
  if (!codec.ok()) return {};
  return {codec->config().key_bytes, codec->config().value_bytes, codec->key_stride(), codec->value_stride(),
          QualityWarning(*o)};
}

// The smallest payload of a stream: the rANS length of n copies of the
// alphabet's most probable symbol.
int MinBytes(int n, int levels) {
  uint16_t freq[kMaxLevels];
  EXPECT_TRUE(ModelFrequencies(n, levels, kDefaultAlpha, freq).ok());
  return *StreamCodec::MinPayloadBytes(n, levels, freq);
}

// docs/api.md, n >= 512 (the legacy rule, LegacyDefaultPayloadBytes):
//   C(n) = max(C_min, min(floor((R n + 512) / 1024), 4 floor((S n + 2048) / 4096) - 4)),
// R = 331 / 231 bytes (keys / values), S = 336 / 236 their strides.
int Legacy(int n, int reference, int reference_stride, int min_bytes) {
  const int64_t share = (static_cast<int64_t>(reference) * n + 512) / 1024;
  const int64_t stride = 4 * ((static_cast<int64_t>(reference_stride) * n + 2048) / 4096);
  return static_cast<int>(std::max<int64_t>(min_bytes, std::min(share, stride - 4)));
}

// docs/api.md, n < 512: the reference's coded bits B = 8 R - 32 per 1024
// values (2616 / 1816), the 8 fixed bytes on top, rounded up to a multiple
// of 4:  C(n) = 4 ceil(max(C_min, ceil((B n + 32768) / 8192)) / 4).
int Documented(int n, int reference, int reference_stride, int min_bytes) {
  if (n >= 512) return Legacy(n, reference, reference_stride, min_bytes);
  const int64_t coded = ((8 * static_cast<int64_t>(reference) - 32) * n + 32768 + 8191) / 8192;
  const int64_t c = std::max<int64_t>(min_bytes, coded);
  return static_cast<int>((c + 3) / 4 * 4);
}

TEST(RecordBudgetTest, DocumentedFormulaIsWhatTheServerResolves) {
  ASSERT_EQ(RecordStride(kReferenceKeyBytes), 336u);
  ASSERT_EQ(RecordStride(kReferenceValueBytes), 236u);
  for (int head_dim : {16, 32, 64, 128, 256}) {
    for (int kv_heads = 1; kv_heads * head_dim <= 8192; kv_heads *= 2) {
      const int n = kv_heads * head_dim;
      SCOPED_TRACE(absl::StrCat(kv_heads, " x ", head_dim));
      const Resolved r = Resolve(kv_heads, head_dim);
      EXPECT_EQ(r.key_bytes, Documented(n, 331, 336, MinBytes(n, kDefaultKeyLevels)));
      EXPECT_EQ(r.value_bytes, Documented(n, 231, 236, MinBytes(n, kDefaultValueLevels)));
      EXPECT_EQ(r.key_stride, RecordStride(r.key_bytes));
      EXPECT_EQ(r.value_stride, RecordStride(r.value_bytes));
    }
  }
}

// From n = 512 up the defaults are those of every release (pages, pool
// files and snapshots of those shapes are unchanged); every n, not only
// powers of two (kv_heads may be any count).
TEST(RecordBudgetTest, DefaultsFrom512UpAreTheLegacyOnes) {
  for (int head_dim : {16, 32, 64, 128, 256}) {
    for (int kv_heads = 1; kv_heads <= 64; ++kv_heads) {
      const int n = kv_heads * head_dim;
      if (n < kCodedBitsRuleBelow) continue;
      SCOPED_TRACE(absl::StrCat(kv_heads, " x ", head_dim));
      for (int levels : {kDefaultValueLevels, kDefaultKeyLevels}) {
        EXPECT_EQ(DefaultPayloadBytes(n, kReferenceKeyBytes, levels, kDefaultAlpha),
                  LegacyDefaultPayloadBytes(n, kReferenceKeyBytes, levels, kDefaultAlpha));
        EXPECT_EQ(DefaultPayloadBytes(n, kReferenceValueBytes, levels, kDefaultAlpha),
                  LegacyDefaultPayloadBytes(n, kReferenceValueBytes, levels, kDefaultAlpha));
      }
    }
  }
  EXPECT_EQ(Resolve(4, 128).key_bytes, 164);
  EXPECT_EQ(Resolve(4, 128).value_bytes, 116);
  EXPECT_EQ(Resolve(8, 128).key_bytes, 331);
  EXPECT_EQ(Resolve(8, 128).value_bytes, 231);
}

// Below n = 512 the record pays for its 8 fixed bytes: the payload codes at
// least the reference's bits per value (n = 128: 1.31 coded bits per value,
// 74% of the reference's, under the legacy rule).
TEST(RecordBudgetTest, SmallShapesCodeTheReferenceBits) {
  const double key_ref = CodedBitsPerValue(kReferenceKeyBytes, kReferenceStreamLength);
  const double value_ref = CodedBitsPerValue(kReferenceValueBytes, kReferenceStreamLength);
  for (int head_dim : {16, 32, 64, 128, 256}) {
    for (int kv_heads = 1; kv_heads * head_dim < kCodedBitsRuleBelow; ++kv_heads) {
      const int n = kv_heads * head_dim;
      SCOPED_TRACE(absl::StrCat(kv_heads, " x ", head_dim));
      const Resolved r = Resolve(kv_heads, head_dim);
      EXPECT_GE(CodedBitsPerValue(r.key_bytes, n), key_ref);
      EXPECT_GE(CodedBitsPerValue(r.value_bytes, n), value_ref);
      EXPECT_EQ(r.key_bytes % 4, 0);  // the stride's alignment bytes are the payload's
      EXPECT_EQ(r.value_bytes % 4, 0);
    }
  }
  const Resolved mqa = Resolve(1, 128);  // one KV head of 128
  EXPECT_GE(CodedBitsPerValue(mqa.value_bytes, 128), kQualityEnvelopeShare * value_ref);
  EXPECT_GE(CodedBitsPerValue(mqa.key_bytes, 128), kQualityEnvelopeShare * key_ref);
}

// Rows "| n | key_bytes | value_bytes | key stride | value stride | coded
// bits | before |" under the heading "Default containers" of docs/api.md;
// "before" is the legacy rule's key and value bytes, or "same".
TEST(RecordBudgetTest, DocTableIsWhatTheServerResolves) {
  std::ifstream in("docs/api.md");
  ASSERT_TRUE(in.good()) << "docs/api.md is not a data dependency";
  std::stringstream text;
  text << in.rdbuf();
  const std::string page = text.str();
  const size_t at = page.find("### Default containers");
  ASSERT_NE(at, std::string::npos);
  const size_t end = std::min(page.find("\n### ", at + 1), page.find("\n## ", at + 1));
  std::istringstream section(page.substr(at, end == std::string::npos ? std::string::npos : end - at));
  const std::regex row(R"(^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| [^|]* \| (same|(\d+), (\d+)) \|$)");
  int rows = 0;
  for (std::string line; std::getline(section, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    const int n = std::stoi(m[1]);
    SCOPED_TRACE(line);
    const Resolved r = n >= 128 ? Resolve(n / 128, 128) : Resolve(1, n);
    EXPECT_EQ(r.key_bytes, std::stoi(m[2]));
    EXPECT_EQ(r.value_bytes, std::stoi(m[3]));
    EXPECT_EQ(static_cast<int>(r.key_stride), std::stoi(m[4]));
    EXPECT_EQ(static_cast<int>(r.value_stride), std::stoi(m[5]));
    const int legacy_key = LegacyDefaultPayloadBytes(n, kReferenceKeyBytes, kDefaultKeyLevels, kDefaultAlpha);
    const int legacy_value = LegacyDefaultPayloadBytes(n, kReferenceValueBytes, kDefaultValueLevels, kDefaultAlpha);
    if (m[6] == "same") {
      EXPECT_EQ(r.key_bytes, legacy_key);
      EXPECT_EQ(r.value_bytes, legacy_value);
    } else {
      EXPECT_EQ(std::stoi(m[7]), legacy_key);
      EXPECT_EQ(std::stoi(m[8]), legacy_value);
    }
    ++rows;
  }
  EXPECT_GE(rows, 9);
}

// The defaults are inside the quality envelope at every shape, so the
// server starts without a warning.
TEST(RecordBudgetTest, DefaultsDoNotWarn) {
  for (int head_dim : {16, 32, 64, 128, 256}) {
    for (int kv_heads = 1; kv_heads <= 64; ++kv_heads) {
      SCOPED_TRACE(absl::StrCat(kv_heads, " x ", head_dim));
      EXPECT_EQ(Resolve(kv_heads, head_dim).warning, "");
    }
  }
}

// Pinned containers below the envelope (here the legacy defaults of small
// shapes, as a deployment that kept its old pages would pin them) warn.
TEST(RecordBudgetTest, PinnedSmallContainersWarnAtStart) {
  EXPECT_NE(Resolve(1, 64, 18, 15).warning, "");
  EXPECT_NE(Resolve(1, 128, 40, 25).warning, "");
  EXPECT_NE(Resolve(2, 128, 80, 56).warning, "");
  EXPECT_EQ(Resolve(1, 128, 48, 36).warning, "");
  EXPECT_EQ(Resolve(1, 128, 45, 33).warning, "");
  EXPECT_EQ(Resolve(4, 128, 164, 116).warning, "");
  const std::string w = Resolve(1, 128, 40, 25).warning;
  EXPECT_NE(w.find("kv_heads x head_dim = 128 with key_bytes/value_bytes 40/25"), std::string::npos) << w;
  EXPECT_NE(w.find("at least 45/33"), std::string::npos) << w;
  EXPECT_NE(w.find("unset, they resolve to 48/36"), std::string::npos) << w;
  EXPECT_NE(w.find("docs/quality.md"), std::string::npos) << w;
}

}  // namespace
}  // namespace driftkv
