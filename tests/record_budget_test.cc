// The default containers docs/api.md states ("Default containers") against
// what the server resolves (ResolveConfig, then the codec the handler
// makes): the documented formula, written out again here, for every
// power-of-two shape, and the page's table of resolved bytes row by row.
// Also the start-up warning for shapes outside the quality envelope.
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

Resolved Resolve(int kv_heads, int head_dim) {
  v1::ServerConfig c;
  c.mutable_model()->set_layers(1);
  c.mutable_model()->set_kv_heads(kv_heads);
  c.mutable_model()->set_head_dim(head_dim);
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

// docs/api.md: C(n) = max(min, min(floor((R n + 512) / 1024),
//                                  4 floor((S n + 2048) / 4096) - 4)),
// R = 331 / 231 bytes (keys / values), S = 336 / 236 their strides.
int Documented(int n, int reference, int reference_stride, int min_bytes) {
  const int64_t share = (static_cast<int64_t>(reference) * n + 512) / 1024;
  const int64_t stride = 4 * ((static_cast<int64_t>(reference_stride) * n + 2048) / 4096);
  return static_cast<int>(std::max<int64_t>(min_bytes, std::min(share, stride - 4)));
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

// Rows "| n | key_bytes | value_bytes | key stride | value stride | ..."
// under the heading "Default containers" of docs/api.md.
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
  const std::regex row(R"(^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|)");
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
    ++rows;
  }
  EXPECT_GE(rows, 6);
}

TEST(RecordBudgetTest, SmallShapesWarnAtStart) {
  EXPECT_NE(Resolve(1, 64).warning, "");
  EXPECT_NE(Resolve(1, 128).warning, "");
  EXPECT_NE(Resolve(2, 128).warning, "");
  EXPECT_EQ(Resolve(4, 128).warning, "");
  EXPECT_EQ(Resolve(8, 128).warning, "");
  EXPECT_EQ(Resolve(16, 128).warning, "");
  const std::string w = Resolve(1, 128).warning;
  EXPECT_NE(w.find("kv_heads x head_dim = 128"), std::string::npos) << w;
  EXPECT_NE(w.find("docs/quality.md"), std::string::npos) << w;
}

}  // namespace
}  // namespace driftkv
