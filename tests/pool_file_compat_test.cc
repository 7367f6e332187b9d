// Pool files of version 1, written by releases whose D-Quant default
// containers stored key_bytes=0 / value_bytes=0, read to the same codec and
// the same floats by this build, whatever its default for n; files of this
// build record the resolved payload sizes (codec/pool_file.h "Versions").
//
// The fixtures in tests/testdata/ were written by `driftkv-codec encode` of
// commit cc5d6c6, before pool files recorded resolved sizes:
//   golden_dquant_unbiased.dkv  n = 2 x 64, defaults (the golden_pool_test
//                               file; its commands are in that script)
//   legacy_v1_n64.dkv           n = 1 x 64, keys at the default, values
//                               pinned to 16 bytes:
//     synth-kv --out t --layers 2 --tokens 40 --kv-heads 1 --head-dim 64
//         --query-tokens 4 --seed 3
//     driftkv-codec encode --keys t.k --values t.v --shape 2,40,1,64
//         --residual 8 --mean-window 16 --v-bytes 16 --out legacy_v1_n64.dkv
// The SHA-256 figures are those of `driftkv-codec decode` of that commit
// (the raw f32 keys and values of every layer, one after the other).
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "codec/dquant_codec.h"
#include "codec/encoded_layer.h"
#include "codec/pool_file.h"
#include "codec/registry.h"
#include "eval/synthetic_kv.h"
#include "gtest/gtest.h"
#include "wire/sha256.h"

namespace driftkv {
namespace {

struct Fixture {
  const char* path;
  SynthParams input;  // what synth-kv wrote for it
  int64_t window;     // --residual
  int key_bytes, value_bytes;
  const char* key_sha256;
  const char* value_sha256;
};

SynthParams Input(int layers, int tokens, int kv_heads, int head_dim, int query_tokens, uint64_t seed) {
  SynthParams p;
  p.layers = layers;
  p.tokens = tokens;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.query_tokens = query_tokens;
  p.seed = seed;
  return p;
}

// key_bytes/value_bytes: LegacyDefaultPayloadBytes where the file holds 0
// (keys 40 and values 25 at n = 128, keys 18 at n = 64), else what it holds.
const Fixture kFixtures[] = {
    {"tests/testdata/golden_dquant_unbiased.dkv", Input(2, 300, 2, 64, 16, 7), 44, 40, 25,
     "1f527b4bc19caa0220fa0980a0467013d2a43e3e2d8035e7625e7d9e6a9f4d49",
     "c57efb32ec460ad37a8b0f3d157c55bc013b4159bded0af53f70213a7b061490"},
    {"tests/testdata/legacy_v1_n64.dkv", Input(2, 40, 1, 64, 4, 3), 8, 18, 16,
     "9807d5219bdc7f5cfee4c65988c845348587fd0331239bab8beab1363fedb792",
     "d23e9a205ab1887f951f5eb0f1ac292fb4f9b450f4564aafe865739236e9691c"},
};

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path << " is not a data dependency";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

uint32_t Version(const std::string& bytes) {
  return static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8 | static_cast<uint8_t>(bytes[10]) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(bytes[11])) << 24;
}

// SHA-256 of the decoded keys and values of every layer, as `decode` writes them.
void DecodedSha256(const Pool& pool, std::string* keys_sha, std::string* values_sha) {
  const size_t per_layer = static_cast<size_t>(pool.tokens) * pool.codec->n();
  std::vector<float> k(per_layer * pool.layers.size()), v(k.size());
  for (size_t l = 0; l < pool.layers.size(); ++l) {
    absl::Status st = DecodeLayer(*pool.codec, pool.layers[l], k.data() + l * per_layer, v.data() + l * per_layer);
    ASSERT_TRUE(st.ok()) << st;
  }
  *keys_sha = Sha256Hex(absl::string_view(reinterpret_cast<const char*>(k.data()), sizeof(float) * k.size()));
  *values_sha = Sha256Hex(absl::string_view(reinterpret_cast<const char*>(v.data()), sizeof(float) * v.size()));
}

TEST(PoolFileCompatTest, VersionOneDefaultsReadWithTheRuleThatWroteThem) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.path);
    const std::string bytes = ReadBytes(f.path);
    ASSERT_GT(bytes.size(), 128u);
    ASSERT_EQ(Version(bytes), 1u);
    ASSERT_NE(bytes.find("key_bytes=0 "), std::string::npos);
    absl::StatusOr<Pool> pool = ParsePool(bytes);
    ASSERT_TRUE(pool.ok()) << pool.status();
    const int n = pool->codec->n();
    EXPECT_EQ(pool->options.key_bytes, f.key_bytes);
    EXPECT_EQ(pool->options.value_bytes, f.value_bytes);
    EXPECT_EQ(pool->options.key_bytes,
              LegacyDefaultPayloadBytes(n, kReferenceKeyBytes, kDefaultKeyLevels, kDefaultAlpha));
    const KvCodec::Settings s = pool->codec->settings();
    EXPECT_EQ(s.key_payload_bytes, f.key_bytes);
    EXPECT_EQ(s.value_payload_bytes, f.value_bytes);
    std::string keys_sha, values_sha;
    DecodedSha256(*pool, &keys_sha, &values_sha);
    EXPECT_EQ(keys_sha, f.key_sha256);
    EXPECT_EQ(values_sha, f.value_sha256);
  }
}

// The old records come out of this build's encoder again when the payloads
// are pinned to what the old default resolved.
TEST(PoolFileCompatTest, PinnedContainersEncodeTheOldRecords) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.path);
    absl::StatusOr<Pool> pool = ParsePool(ReadBytes(f.path));
    ASSERT_TRUE(pool.ok()) << pool.status();
    CodecOptions pinned = pool->options;
    pinned.key_bytes = f.key_bytes;
    pinned.value_bytes = f.value_bytes;
    absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(pinned);
    ASSERT_TRUE(codec.ok()) << codec.status();
    const SynthKv kv = GenerateSynth(f.input);
    const size_t per_layer = static_cast<size_t>(f.input.tokens) * (*codec)->n();
    for (size_t l = 0; l < pool->layers.size(); ++l) {
      EncodedLayer e;
      absl::Status st = EncodeLayer(**codec, kv.keys.data() + l * per_layer, kv.values.data() + l * per_layer,
                                    f.input.tokens, f.window, 1, &e, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(e.key_records, pool->layers[l].key_records) << "layer " << l;
      EXPECT_EQ(e.value_records, pool->layers[l].value_records) << "layer " << l;
      EXPECT_EQ(e.side, pool->layers[l].side) << "layer " << l;
    }
  }
}

// Written again, a version 1 file becomes version 2 with the sizes it was
// read with, the same records and the same floats.
TEST(PoolFileCompatTest, RewrittenFilesRecordTheResolvedPayloads) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.path);
    absl::StatusOr<Pool> pool = ParsePool(ReadBytes(f.path));
    ASSERT_TRUE(pool.ok()) << pool.status();
    absl::StatusOr<std::string> again = SerializePool(*pool);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(Version(*again), kPoolVersion);
    EXPECT_NE(again->find(absl::StrCat(" key_bytes=", f.key_bytes, " value_bytes=", f.value_bytes, " ")),
              std::string::npos);
    absl::StatusOr<Pool> back = ParsePool(*again);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->layers.size(), pool->layers.size());
    for (size_t l = 0; l < pool->layers.size(); ++l) {
      EXPECT_EQ(back->layers[l].key_records, pool->layers[l].key_records);
      EXPECT_EQ(back->layers[l].value_records, pool->layers[l].value_records);
    }
    std::string keys_sha, values_sha;
    DecodedSha256(*back, &keys_sha, &values_sha);
    EXPECT_EQ(keys_sha, f.key_sha256);
    EXPECT_EQ(values_sha, f.value_sha256);
  }
}

// A new file never stores 0 for a D-Quant payload, and a version 2 file
// that holds one is refused rather than guessed.
TEST(PoolFileCompatTest, VersionTwoStoresResolvedSizesAndRefusesZero) {
  CodecOptions o;
  o.kv_heads = 1;
  o.head_dim = 64;
  o.mean_window = 16;
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(o);
  ASSERT_TRUE(codec.ok()) << codec.status();
  const KvCodec::Settings s = (*codec)->settings();
  const SynthKv kv = GenerateSynth(Input(1, 20, 1, 64, 1, 5));
  Pool pool;
  pool.options = o;
  pool.tokens = 20;
  pool.layers.emplace_back();
  ASSERT_TRUE(EncodeLayer(**codec, kv.keys.data(), kv.values.data(), 20, 4, 1, &pool.layers[0], nullptr).ok());
  pool.codec = *std::move(codec);
  absl::StatusOr<std::string> bytes = SerializePool(pool);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(Version(*bytes), 2u);
  EXPECT_EQ(bytes->find("key_bytes=0 "), std::string::npos);
  EXPECT_NE(bytes->find(absl::StrCat(" key_bytes=", s.key_payload_bytes, " value_bytes=", s.value_payload_bytes, " ")),
            std::string::npos);
  absl::StatusOr<Pool> back = ParsePool(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->options.key_bytes, s.key_payload_bytes);

  // Options that contradict the codec are not written.
  pool.options.value_bytes = s.value_payload_bytes + 4;
  EXPECT_FALSE(SerializePool(pool).ok());

  // A version 1 file relabelled version 2 holds key_bytes=0: refused.
  std::string relabelled = ReadBytes("tests/testdata/legacy_v1_n64.dkv");
  relabelled[8] = 2;
  absl::StatusOr<Pool> refused = ParsePool(relabelled);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("key_bytes=0"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace driftkv
