// WUSH-KV transforms in the service, CPU backend, without a
// network: pages are bit-identical to what TransformedKvCodec/EncodeLayer
// writes for the same tokens, Read returns the model's domain, Attend equals
// TransformedCompressedAttention (one pass and split-KV), folded values are
// stored untouched, the value limit follows the transform, Info reports the
// transform, and every config error names its field.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codec/compressed_attention.h"
#include "codec/encoded_layer.h"
#include "codec/registry.h"
#include "codec/transform/transform.h"
#include "codec/transform/transform_attention.h"
#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/random_wush.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::RoundBf16;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

// SmallOptions' shape: 2 layers x 2 KV heads x 64, pages of 32, window 32.
constexpr int kLayers = 2, kKvHeads = 2, kD = 64, kN = 128, kP = 32, kR = 32;
constexpr uint64_t kCalibrationTokens = 1234;

// Transforms of the test shape (tests/random_wush.h): different for every
// (layer, head, K/V) and every seed.
TransformSet RandomWushSet(uint64_t seed) {
  return testing::RandomWushSet(kLayers, kKvHeads, kD, seed, kCalibrationTokens);
}

ServiceOptions WushOptions(const TransformSet& set, bool values_folded) {
  ServiceOptions o = SmallOptions();
  o.transform = TransformKind::kWush;
  o.codec.hadamard = false;
  o.transforms = std::make_shared<const TransformSet>(set);
  o.transforms_file = "in-memory";
  o.values_folded = values_folded;
  return o;
}

// The codec the service must match: D-Quant of the same settings behind the
// transform stage of `layer`.
std::unique_ptr<KvCodec> ReferenceCodec(const TransformSet& set, int layer, bool values_folded) {
  CodecOptions o;
  o.kv_heads = kKvHeads;
  o.head_dim = kD;
  o.mean_window = kP;
  absl::StatusOr<std::unique_ptr<KvCodec>> c =
      MakeTransformedCodec(o, TransformKind::kWush, &set, layer, values_folded);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

class WushServiceTest : public testing::HandlerFixture {
 protected:
  WushServiceTest() : HandlerFixture(testing::FixtureClock::kReal) {}

  absl::Status Push(const std::string& seq, uint32_t layer, const testing::Kv& kv, int tokens, int chunk = 97) {
    return testing::PushTokens(*h_, seq, layer, kv, 0, tokens, chunk);
  }

  // The whole layer, read back as f32.
  void ReadAll(const std::string& seq, uint32_t layer, std::vector<float>* keys, std::vector<float>* values) {
    v1::ReadRequest rr;
    rr.set_sequence_id(seq);
    rr.set_layer(layer);
    keys->clear();
    values->clear();
    ASSERT_TRUE(h_->Read(rr, [&](const v1::ReadChunk& c) {
                    const size_t at = keys->size();
                    keys->resize(at + c.keys().size() / 4);
                    values->resize(at + c.values().size() / 4);
                    std::memcpy(keys->data() + at, c.keys().data(), c.keys().size());
                    std::memcpy(values->data() + at, c.values().data(), c.values().size());
                    return true;
                  }).ok());
  }

  testing::Attention Attend(const std::string& seq, uint32_t layer, const std::vector<float>& q, int q_heads) {
    v1::AttendRequest req;
    *req.add_items() = testing::QueryItem(seq, layer, q, q_heads);
    v1::AttendResponse resp;
    absl::Status st = h_->Attend(req, &resp);
    EXPECT_TRUE(st.ok()) << st;
    testing::Attention a;
    if (!st.ok()) return a;
    a.out.resize(static_cast<size_t>(q_heads) * kD);
    std::memcpy(a.out.data(), resp.results(0).output().data(), a.out.size() * 4);
    a.lse.assign(resp.results(0).lse().begin(), resp.results(0).lse().end());
    return a;
  }

  // Asserts that every block of `enc` is, byte for byte, one page in use in
  // the pool (keys, values and the key-mean record), each a different page.
  void ExpectPagesAre(const KvCodec& codec, const EncodedLayer& enc) {
    const PagePool& pool = h_->pool();
    const size_t ks = kP * codec.key_stride(), vs = kP * codec.value_stride(), ms = codec.side_stride();
    std::vector<bool> used(pool.capacity_pages(), false);
    for (int64_t b = 0; b < enc.blocks(kP); ++b) {
      PageId found = -1;
      for (PageId p = 0; p < pool.capacity_pages() && found < 0; ++p) {
        if (!used[p] && std::memcmp(pool.key_records(p), enc.key_records.data() + b * ks, ks) == 0) found = p;
      }
      ASSERT_GE(found, 0) << "no page holds the key records of block " << b;
      used[found] = true;
      EXPECT_EQ(std::memcmp(pool.value_records(found), enc.value_records.data() + b * vs, vs), 0) << b;
      EXPECT_EQ(std::memcmp(pool.mean_record(found), enc.side.data() + b * ms, ms), 0) << b;
    }
  }
};

// Tokens [0, tokens) of a layer encoded as the service stores them: full
// pages below a window of R..R+P-1 tokens, from the bf16-rounded values.
EncodedLayer EncodeLikeTheService(const KvCodec& codec, const testing::Kv& kv, int tokens) {
  const int pages = tokens >= kR + kP ? (tokens - kR) / kP : 0;
  const std::vector<float> k = RoundBf16(kv.keys.data(), static_cast<size_t>(tokens) * kN);
  const std::vector<float> v = RoundBf16(kv.values.data(), static_cast<size_t>(tokens) * kN);
  EncodedLayer enc;
  absl::Status st = EncodeLayer(codec, k.data(), v.data(), tokens, tokens - pages * kP, 1, &enc, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return enc;
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// (b) Pages, Read and Attend of both layers (each its own transforms) match
// the codec's transform stage over the same tokens.
TEST_F(WushServiceTest, PagesReadAndAttendMatchTransformedKvCodec) {
  const TransformSet set = RandomWushSet(1);
  Make(WushOptions(set, false));
  const int tokens = 200, q_heads = 4;  // 5 pages, 40 window tokens
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    SCOPED_TRACE(layer);
    const testing::Kv kv = SyntheticKv(tokens, kN, 10 + layer);
    const std::string seq = absl::StrCat("s", layer);
    ASSERT_TRUE(Push(seq, layer, kv, tokens).ok());
    std::unique_ptr<KvCodec> codec = ReferenceCodec(set, layer, false);
    ASSERT_NE(codec, nullptr);
    const EncodedLayer enc = EncodeLikeTheService(*codec, kv, tokens);
    ASSERT_EQ(enc.compressed, 5 * kP);
    ExpectPagesAre(*codec, enc);

    // Read: the page tokens exactly as DecodeLayer gives them (model domain).
    std::vector<float> keys, values, dk(static_cast<size_t>(tokens) * kN), dv(dk.size());
    ReadAll(seq, layer, &keys, &values);
    ASSERT_TRUE(DecodeLayer(*codec, enc, dk.data(), dv.data()).ok());
    ASSERT_EQ(keys.size(), dk.size());
    EXPECT_EQ(keys, dk);
    EXPECT_EQ(values, dv);

    // Attend: TransformedCompressedAttention over the same blocks and window.
    const std::vector<float> q = SyntheticQuery(q_heads, kD, 20 + layer);
    const testing::Attention got = Attend(seq, layer, q, q_heads);
    const std::vector<CompressedBlock> blocks = LayerBlocks(*codec, enc, enc.compressed);
    const Bf16Tokens window{enc.window_keys.data(), enc.window_values.data(), enc.window};
    std::vector<float> out(static_cast<size_t>(q_heads) * kD), lse(q_heads);
    AttentionScratch scratch;
    ASSERT_TRUE(TransformedCompressedAttention(dynamic_cast<const TransformedKvCodec&>(*codec), blocks, window,
                                               q.data(), q_heads, 0.125f, out.data(), lse.data(), &scratch)
                    .ok());
    ASSERT_EQ(got.out.size(), out.size());
    EXPECT_LT(RelativeL2(got.out, out), 1e-5);
    for (int h = 0; h < q_heads; ++h) EXPECT_NEAR(got.lse[h], lse[h], 1e-5 * std::fabs(lse[h]) + 1e-6);
    // The other layer's transforms give other pages: the layer is honoured.
    std::unique_ptr<KvCodec> other = ReferenceCodec(set, 1 - layer, false);
    const EncodedLayer wrong = EncodeLikeTheService(*other, kv, tokens);
    EXPECT_NE(wrong.key_records, enc.key_records);
  }
}

// 600 tokens = 17 pages: with 4 threads one item is split into 2 parts whose
// states are merged after each mapped its pages' output back.
TEST_F(WushServiceTest, SplitKvAttentionMatchesOnePass) {
  const TransformSet set = RandomWushSet(2);
  ServiceOptions o = WushOptions(set, false);
  o.backend_threads = 4;
  Make(o);
  const int tokens = 600, q_heads = 4;
  const testing::Kv kv = SyntheticKv(tokens, kN, 30);
  ASSERT_TRUE(Push("long", 1, kv, tokens, 256).ok());
  std::unique_ptr<KvCodec> codec = ReferenceCodec(set, 1, false);
  const EncodedLayer enc = EncodeLikeTheService(*codec, kv, tokens);
  ASSERT_EQ(enc.compressed, 17 * kP);
  const std::vector<float> q = SyntheticQuery(q_heads, kD, 31);
  const testing::Attention got = Attend("long", 1, q, q_heads);
  const std::vector<CompressedBlock> blocks = LayerBlocks(*codec, enc, enc.compressed);
  std::vector<float> out(static_cast<size_t>(q_heads) * kD), lse(q_heads);
  AttentionScratch scratch;
  ASSERT_TRUE(TransformedCompressedAttention(dynamic_cast<const TransformedKvCodec&>(*codec), blocks,
                                             Bf16Tokens{enc.window_keys.data(), enc.window_values.data(), enc.window},
                                             q.data(), q_heads, 0.125f, out.data(), lse.data(), &scratch)
                  .ok());
  // The parts' softmax states are merged in another order than one pass
  // takes, and T_V^-1 (condition number > 1) maps each part: float rounding,
  // a few 1e-5.
  EXPECT_LT(RelativeL2(got.out, out), 2e-4);
  for (int h = 0; h < q_heads; ++h) EXPECT_NEAR(got.lse[h], lse[h], 1e-5 * std::fabs(lse[h]) + 1e-6);
  // Both against float64 attention over the decoded cache: the split is not
  // less accurate than the one pass.
  std::vector<float> dk(static_cast<size_t>(tokens) * kN), dv(dk.size());
  ASSERT_TRUE(DecodeLayer(*codec, enc, dk.data(), dv.data()).ok());
  std::vector<double> ref(out.size()), ref_lse(q_heads);
  ReferenceAttention(dk.data(), dv.data(), tokens, kKvHeads, kD, q.data(), q_heads, 0.125, ref.data(), ref_lse.data());
  const std::vector<float> ref_f(ref.begin(), ref.end());
  const double split_err = RelativeL2(got.out, ref_f), one_err = RelativeL2(out, ref_f);
  std::printf("vs float64 over the decoded cache: split %.3g, one pass %.3g, split vs one pass %.3g\n", split_err,
              one_err, RelativeL2(got.out, out));
  EXPECT_LE(split_err, 2 * one_err + 1e-5);
}

// (a) Read returns the model's domain, within the codec's error, for every
// transform; without T^-1 the keys would be T_K k, nowhere near k.
TEST_F(WushServiceTest, ReadIsTheModelDomainForEveryTransform) {
  const TransformSet set = RandomWushSet(3);
  const int tokens = 200;
  const testing::Kv kv = SyntheticKv(tokens, kN, 40);
  const size_t paged = static_cast<size_t>(5 * kP) * kN;
  const std::vector<float> k_ref(kv.keys.begin(), kv.keys.begin() + paged);
  const std::vector<float> v_ref(kv.values.begin(), kv.values.begin() + paged);
  double hadamard_ek = 0, hadamard_ev = 0;
  for (TransformKind kind : {TransformKind::kHadamard, TransformKind::kIdentity, TransformKind::kWush}) {
    SCOPED_TRACE(TransformName(kind));
    ServiceOptions o = SmallOptions();
    if (kind == TransformKind::kWush) o = WushOptions(set, false);
    o.transform = kind;
    o.codec.hadamard = kind == TransformKind::kHadamard;
    Make(o);
    ASSERT_TRUE(Push("r", 0, kv, tokens).ok());
    std::vector<float> keys, values;
    ReadAll("r", 0, &keys, &values);
    ASSERT_EQ(keys.size(), static_cast<size_t>(tokens) * kN);
    const double ek = RelativeL2(std::vector<float>(keys.begin(), keys.begin() + paged), k_ref);
    const double ev = RelativeL2(std::vector<float>(values.begin(), values.begin() + paged), v_ref);
    std::printf("%s: page tokens read back, relative L2 error keys %.4f values %.4f\n", TransformName(kind), ek, ev);
    // 8 key levels: about 0.2 of the noise; 6 value levels on Gaussian
    // values: about 0.83 read back (the unbiased value grid's scale is
    // 1/rho^2 of the least-squares one). Keys stored as T_K k and read without T_K^-1 would
    // be off by more than their own size. Random statistics give no WUSH
    // gain, but no large loss either. (No rotation at all, "identity", does
    // lose on keys whose outlier channels RoPE moves within a window.)
    if (kind == TransformKind::kHadamard) hadamard_ek = ek, hadamard_ev = ev;
    EXPECT_LT(ek, 0.3);
    EXPECT_LT(ev, 0.9);
    if (kind == TransformKind::kWush) {
      EXPECT_LT(ek, 1.25 * hadamard_ek);
      EXPECT_LT(ev, 1.25 * hadamard_ev);
    }
    EXPECT_GT(ek, 1e-3);  // lossy: the comparison can fail
    for (size_t i = paged; i < keys.size(); ++i) {
      ASSERT_EQ(keys[i], Bf16ToFloat(FloatToBf16(kv.keys[i]))) << i;  // the window as pushed
    }
  }
}

// (c) Folded values are stored untouched by T_V: the value records are what
// D-Quant without rotation writes for the raw values; Read returns them
// without T_V^-1, and Attend matches the codec's folded path.
TEST_F(WushServiceTest, FoldedValuesAreStoredUntouched) {
  const TransformSet set = RandomWushSet(4);
  Make(WushOptions(set, true));
  const int tokens = 200, q_heads = 2;
  const testing::Kv kv = SyntheticKv(tokens, kN, 50);
  ASSERT_TRUE(Push("f", 1, kv, tokens).ok());
  std::unique_ptr<KvCodec> codec = ReferenceCodec(set, 1, true);
  const EncodedLayer enc = EncodeLikeTheService(*codec, kv, tokens);
  ExpectPagesAre(*codec, enc);
  // The value records alone: D-Quant without rotation over the raw values.
  DQuantConfig plain = WushOptions(set, true).codec;
  absl::StatusOr<DQuantCodec> identity = DQuantCodec::Create(plain);
  ASSERT_TRUE(identity.ok());
  const std::vector<float> k = RoundBf16(kv.keys.data(), static_cast<size_t>(kP) * kN);
  const std::vector<float> v = RoundBf16(kv.values.data(), static_cast<size_t>(kP) * kN);
  std::vector<uint8_t> kr(kP * identity->key_stride()), vr(kP * identity->value_stride()), mr(identity->mean_stride());
  CodecScratch scratch;
  StreamStats ks, vs;
  ASSERT_TRUE(identity->EncodeWindow(k.data(), v.data(), kP, kr.data(), vr.data(), mr.data(), &scratch, &ks, &vs).ok());
  EXPECT_TRUE(std::equal(vr.begin(), vr.end(), enc.value_records.begin()));
  EXPECT_FALSE(std::equal(kr.begin(), kr.end(), enc.key_records.begin()));  // keys are transformed

  std::vector<float> keys, values, dk(static_cast<size_t>(tokens) * kN), dv(dk.size());
  ReadAll("f", 1, &keys, &values);
  ASSERT_TRUE(DecodeLayer(*codec, enc, dk.data(), dv.data()).ok());
  EXPECT_EQ(keys, dk);
  EXPECT_EQ(values, dv);
  const size_t paged = static_cast<size_t>(enc.compressed) * kN;
  EXPECT_LT(RelativeL2(std::vector<float>(values.begin(), values.begin() + paged),
                       std::vector<float>(kv.values.begin(), kv.values.begin() + paged)),
            0.8);

  const std::vector<float> q = SyntheticQuery(q_heads, kD, 51);
  const testing::Attention got = Attend("f", 1, q, q_heads);
  std::vector<float> out(static_cast<size_t>(q_heads) * kD), lse(q_heads);
  AttentionScratch as;
  ASSERT_TRUE(TransformedCompressedAttention(dynamic_cast<const TransformedKvCodec&>(*codec),
                                             LayerBlocks(*codec, enc, enc.compressed),
                                             Bf16Tokens{enc.window_keys.data(), enc.window_values.data(), enc.window},
                                             q.data(), q_heads, 0.125f, out.data(), lse.data(), &as)
                  .ok());
  EXPECT_LT(RelativeL2(got.out, out), 1e-5);
  // Pages and window hold the same (folded) values, so the merged output is
  // attention over the decoded cache in that domain.
  std::vector<double> ref(out.size()), ref_lse(q_heads);
  ReferenceAttention(dk.data(), dv.data(), tokens, kKvHeads, kD, q.data(), q_heads, 0.125, ref.data(), ref_lse.data());
  EXPECT_LT(RelativeL2(got.out, std::vector<float>(ref.begin(), ref.end())), 1e-4);
}

// The accepted |x| follows the transform's gain: with T = 200 I a key of 500
// would leave the fp16 grid (and block its layer when its page is encoded),
// so it is refused at Append; 100 still encodes.
TEST_F(WushServiceTest, ValueLimitFollowsTheTransformGain) {
  TransformSet set = RandomWushSet(5);
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (int i = 0; i < kD * kD; ++i) {
        const bool diag = i % (kD + 1) == 0;
        set.matrix(l, h, Mat::kKey)[i] = diag ? 200.0f : 0.0f;
        set.matrix(l, h, Mat::kKeyInverse)[i] = diag ? 1.0f / 200.0f : 0.0f;
      }
    }
  }
  Make(WushOptions(set, true));
  testing::Kv kv = SyntheticKv(80, kN, 60);
  kv.keys[5] = 500.0f;  // below the Hadamard limit 65504 / 16 = 4094
  absl::Status st = Push("big", 0, kv, 80, 80);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "keys element 5 is 500; |x| must be <= 163.76")) << st;
  v1::StatsResponse s;
  h_->Stats(&s);
  EXPECT_EQ(s.sequences(), 0u);
  kv.keys[5] = 100.0f;
  EXPECT_TRUE(Push("big", 0, kv, 80, 80).ok());
  h_->Stats(&s);
  EXPECT_EQ(s.pages_in_use(), 1u);
}

// Info and the Handler's own check of the options.
TEST_F(WushServiceTest, InfoReportsTheTransform) {
  const TransformSet set = RandomWushSet(6);
  Make(WushOptions(set, true));
  v1::InfoResponse info;
  h_->Info(&info);
  EXPECT_EQ(info.transform(), "wush");
  const std::string bytes = SerializeTransforms(set);
  uint64_t trailing = 0;
  for (int i = 0; i < 8; ++i)
    trailing |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[bytes.size() - 8 + i])) << (8 * i);
  EXPECT_EQ(info.transforms_checksum(), trailing);
  EXPECT_NE(trailing, 0u);
  EXPECT_EQ(info.transforms_calibration_tokens(), kCalibrationTokens);
  EXPECT_TRUE(info.values_folded());

  Make(SmallOptions());
  info.Clear();
  h_->Info(&info);
  EXPECT_EQ(info.transform(), "hadamard");
  EXPECT_EQ(info.transforms_checksum(), 0u);
  EXPECT_FALSE(info.values_folded());

  // Options that disagree with themselves are refused by the handler too.
  ServiceOptions o = WushOptions(set, false);
  o.transforms = nullptr;
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, &metrics_);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(h.status().message(), "codec.transform \"wush\" needs codec.transforms_file"))
      << h.status();
  o = WushOptions(set, false);
  o.codec.hadamard = true;
  h = Handler::Create(o, &metrics_);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
}

// (d) Config: each error with its code and field; a valid wush config loads
// the set and switches the codec's rotation off.
TEST(WushConfigTest, ErrorsNameTheFieldAndValidConfigsResolve) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/good.xfm", cut = dir + "/cut.xfm", flipped = dir + "/flipped.xfm";
  const TransformSet set = RandomWushSet(7);
  ASSERT_TRUE(WriteTransformsFile(good, set).ok());
  const std::string bytes = SerializeTransforms(set);
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, 1000);
  std::string bad = bytes;
  bad[100] ^= 1;
  std::ofstream(flipped, std::ios::binary) << bad;

  v1::ServerConfig c;
  c.mutable_model()->set_layers(kLayers);
  c.mutable_model()->set_kv_heads(kKvHeads);
  c.mutable_model()->set_head_dim(kD);
  c.mutable_codec()->set_page_tokens(kP);
  c.set_pool_bytes(1 << 20);
  auto expect_error = [&](const v1::ServerConfig& cfg, const std::string& text) {
    absl::StatusOr<ServiceOptions> o = ResolveConfig(cfg);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(o.status().message(), text)) << o.status();
  };
  v1::ServerConfig x = c;
  x.mutable_codec()->set_transform("rotate");
  expect_error(x, "codec.transform \"rotate\" unknown; use identity, hadamard or wush");
  x = c;
  x.mutable_codec()->set_transform("wush");
  expect_error(x, "codec.transforms_file is required with codec.transform \"wush\"");
  x.mutable_codec()->set_transforms_file(dir + "/missing.xfm");
  expect_error(x, absl::StrCat("codec.transforms_file: cannot open transforms file ", dir, "/missing.xfm"));
  x.mutable_codec()->set_transforms_file(cut);
  expect_error(x, absl::StrCat("codec.transforms_file: ", cut, ": transforms file is 1000 bytes"));
  x.mutable_codec()->set_transforms_file(flipped);
  expect_error(x, absl::StrCat("codec.transforms_file: ", flipped, ": transforms file checksum mismatch"));
  x.mutable_codec()->set_transforms_file(good);
  x.mutable_model()->set_layers(3);
  expect_error(x, absl::StrCat("codec.transforms_file \"", good, "\" has layers 2 but model.layers is 3"));
  x = c;
  x.mutable_codec()->set_transform("wush");
  x.mutable_codec()->set_transforms_file(good);
  x.mutable_model()->set_kv_heads(4);
  expect_error(x, "has kv_heads 2 but model.kv_heads is 4");
  x.mutable_model()->set_kv_heads(kKvHeads);
  x.mutable_model()->set_head_dim(128);
  expect_error(x, "has head_dim 64 but model.head_dim is 128");
  x = c;
  x.mutable_codec()->set_values_folded(true);
  expect_error(x, "codec.values_folded true needs codec.transform \"wush\", not \"hadamard\"");
  x = c;
  x.mutable_codec()->set_transform("identity");
  x.mutable_codec()->set_transforms_file(good);
  expect_error(x, absl::StrCat("codec.transforms_file \"", good, "\" is only used with codec.transform \"wush\""));

  absl::StatusOr<ServiceOptions> o = ResolveConfig(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transform, TransformKind::kHadamard);
  EXPECT_TRUE(o->codec.hadamard);
  EXPECT_EQ(o->transforms, nullptr);
  x = c;
  x.mutable_codec()->set_transform("identity");
  o = ResolveConfig(x);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transform, TransformKind::kIdentity);
  EXPECT_FALSE(o->codec.hadamard);

  // The text format, as driftkv-server reads it.
  const std::string path = dir + "/wush.textproto";
  std::ofstream(path) << "model { layers: 2 kv_heads: 2 head_dim: 64 }\n"
                      << "codec { page_tokens: 32 transform: \"wush\" transforms_file: \"" << good
                      << "\" values_folded: true }\npool_bytes: 1048576\n";
  absl::StatusOr<v1::ServerConfig> loaded = LoadConfigFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  o = ResolveConfig(*loaded);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transform, TransformKind::kWush);
  EXPECT_FALSE(o->codec.hadamard);
  EXPECT_TRUE(o->values_folded);
  ASSERT_NE(o->transforms, nullptr);
  EXPECT_EQ(SerializeTransforms(*o->transforms), bytes);
  Metrics m;
  EXPECT_TRUE(Handler::Create(*o, &m).ok());
}

}  // namespace
}  // namespace driftkv
