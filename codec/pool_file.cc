#include "codec/pool_file.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "codec/dquant_kv_codec.h"

namespace driftkv {
namespace {

void PutU32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
}
void PutU64(std::string* s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
}
uint32_t GetU32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}
uint64_t GetU64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

struct Geometry {
  int64_t compressed, window, blocks, layer_stride;
};

Geometry LayerGeometry(const KvCodec& c, int64_t tokens, int64_t compressed) {
  Geometry g;
  g.compressed = compressed;
  g.window = tokens - compressed;
  g.blocks = (compressed + c.block_tokens() - 1) / c.block_tokens();
  g.layer_stride = compressed * static_cast<int64_t>(c.key_stride() + c.value_stride()) +
                   g.blocks * static_cast<int64_t>(c.side_stride()) + 2 * 2 * g.window * c.n();
  return g;
}

// D-Quant's frequency tables (zeros for other codecs).
void Frequencies(const KvCodec& c, uint16_t* k, uint16_t* v) {
  std::memset(k, 0, 32);
  std::memset(v, 0, 32);
  const auto* dq = dynamic_cast<const DQuantKvCodec*>(&c);
  if (dq == nullptr) return;
  for (int m = 0; m < dq->codec().key_codec().levels(); ++m) k[m] = dq->codec().key_codec().table().freq[m];
  for (int m = 0; m < dq->codec().value_codec().levels(); ++m) v[m] = dq->codec().value_codec().table().freq[m];
}

}  // namespace

std::string FormatCodecOptions(const CodecOptions& o) {
  return absl::StrCat("codec=", o.name, " kv_heads=", o.kv_heads, " head_dim=", o.head_dim,
                      " key_levels=", o.key_levels, " value_levels=", o.value_levels, " key_bytes=", o.key_bytes,
                      " value_bytes=", o.value_bytes, " alpha=", o.alpha, " mean_window=", o.mean_window,
                      " bits=", o.bits, " group=", o.group, " kappa_k=", o.kappa_k, " kappa_v=", o.kappa_v,
                      " seed=", o.seed, " rotation=", o.rotation);
}

absl::StatusOr<CodecOptions> ParseCodecOptions(const std::string& text) {
  CodecOptions o;
  for (absl::string_view item : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string& k = kv.first;
    const std::string& v = kv.second;
    bool ok = true;
    if (k == "codec")
      o.name = v;
    else if (k == "kv_heads")
      ok = absl::SimpleAtoi(v, &o.kv_heads);
    else if (k == "head_dim")
      ok = absl::SimpleAtoi(v, &o.head_dim);
    else if (k == "key_levels")
      ok = absl::SimpleAtoi(v, &o.key_levels);
    else if (k == "value_levels")
      ok = absl::SimpleAtoi(v, &o.value_levels);
    else if (k == "key_bytes")
      ok = absl::SimpleAtoi(v, &o.key_bytes);
    else if (k == "value_bytes")
      ok = absl::SimpleAtoi(v, &o.value_bytes);
    else if (k == "alpha")
      ok = absl::SimpleAtod(v, &o.alpha);
    else if (k == "mean_window")
      ok = absl::SimpleAtoi(v, &o.mean_window);
    else if (k == "bits")
      ok = absl::SimpleAtoi(v, &o.bits);
    else if (k == "group")
      ok = absl::SimpleAtoi(v, &o.group);
    else if (k == "kappa_k")
      ok = absl::SimpleAtod(v, &o.kappa_k);
    else if (k == "kappa_v")
      ok = absl::SimpleAtod(v, &o.kappa_v);
    else if (k == "seed")
      ok = absl::SimpleAtoi(v, &o.seed);
    else if (k == "rotation")
      o.rotation = v;
    else
      return absl::InvalidArgumentError(absl::StrCat("unknown codec option \"", k, "\""));
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("codec option ", k, "=\"", v, "\" is not a number"));
  }
  return o;
}

namespace {

constexpr int kChecksumHexDigits = 16;  // a u64

bool IsTransformKey(absl::string_view k) {
  return k == "transform" || k == "transform_layer" || k == "values_folded" || k == "transforms_fnv";
}

std::string FormatPoolTransform(const PoolTransform& t) {
  if (t.kind.empty()) return "";
  std::string out = absl::StrCat(" transform=", t.kind);
  if (t.kind == "wush") {
    absl::StrAppend(&out, " transform_layer=", t.layer, " values_folded=", t.values_folded ? 1 : 0,
                    " transforms_fnv=", absl::Hex(t.transforms_checksum, absl::kZeroPad16));
  }
  return out;
}

// Splits the options text into the codec's options and the transform's.
absl::Status ParseOptionsText(const std::string& text, CodecOptions* options, PoolTransform* t) {
  std::string codec_text;
  for (absl::string_view item : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string& k = kv.first;
    const std::string& v = kv.second;
    if (!IsTransformKey(k)) {
      absl::StrAppend(&codec_text, codec_text.empty() ? "" : " ", item);
      continue;
    }
    bool ok = true;
    int folded = 0;
    if (k == "transform") {
      ok = v == "identity" || v == "hadamard" || v == "wush";
      t->kind = v;
    } else if (k == "transform_layer") {
      ok = absl::SimpleAtoi(v, &t->layer);
    } else if (k == "values_folded") {
      ok = absl::SimpleAtoi(v, &folded) && (folded == 0 || folded == 1);
      t->values_folded = folded == 1;
    } else {
      ok = v.size() == kChecksumHexDigits && absl::SimpleHexAtoi(v, &t->transforms_checksum);
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("pool option ", k, "=\"", v, "\" is invalid"));
  }
  absl::StatusOr<CodecOptions> o = ParseCodecOptions(codec_text);
  if (!o.ok()) return o.status();
  *options = *std::move(o);
  return absl::OkStatus();
}

// The options a file of kPoolVersion stores: a codec with payload sizes
// (D-Quant) has them resolved, a 0 replaced by what `c` resolved it to.
absl::StatusOr<CodecOptions> OptionsToStore(const CodecOptions& options, const KvCodec& c) {
  const KvCodec::Settings s = c.settings();
  CodecOptions o = options;
  if (s.key_payload_bytes == 0 && s.value_payload_bytes == 0) {
    // No such knob; D-Quant has it, and a 0 in its file would be refused.
    if (o.name != "dquant") return o;
    return absl::InvalidArgumentError("the pool's D-Quant codec does not report its payload sizes");
  }
  if ((o.key_bytes != 0 && o.key_bytes != s.key_payload_bytes) ||
      (o.value_bytes != 0 && o.value_bytes != s.value_payload_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("pool options key_bytes=", o.key_bytes,
                                                   " value_bytes=", o.value_bytes, " but its codec has ",
                                                   s.key_payload_bytes, " and ", s.value_payload_bytes));
  }
  o.key_bytes = s.key_payload_bytes;
  o.value_bytes = s.value_payload_bytes;
  return o;
}

// D-Quant's payload sizes as the file's writer resolved them. Version 1
// stored 0 for the default: the rule of the releases that wrote it
// resolves it, never today's (which may differ). From version 2 a 0 would
// be ambiguous and is refused.
absl::Status ResolveStoredPayloads(uint32_t version, CodecOptions* o) {
  if (o->name != "dquant") return absl::OkStatus();
  if (version >= kPoolFirstResolvedVersion) {
    if (o->key_bytes > 0 && o->value_bytes > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("pool file version ", version, " stores key_bytes=", o->key_bytes,
                                                   " value_bytes=", o->value_bytes,
                                                   "; from version 2 both are the resolved payload sizes"));
  }
  if (o->key_bytes != 0 && o->value_bytes != 0) return absl::OkStatus();
  // n only after the codec's range checks of the shape.
  absl::StatusOr<std::unique_ptr<KvCodec>> checked = MakeKvCodec(*o);
  if (!checked.ok()) return checked.status();
  const int n = (*checked)->n();
  if (o->key_bytes == 0) o->key_bytes = LegacyDefaultPayloadBytes(n, kReferenceKeyBytes, o->key_levels, o->alpha);
  if (o->value_bytes == 0) {
    o->value_bytes = LegacyDefaultPayloadBytes(n, kReferenceValueBytes, o->value_levels, o->alpha);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SerializePool(const Pool& pool) {
  const KvCodec& c = *pool.codec;
  if (pool.layers.empty()) return absl::InvalidArgumentError("pool has no layers");
  const int64_t compressed = pool.layers[0].compressed;
  const Geometry g = LayerGeometry(c, pool.tokens, compressed);
  absl::StatusOr<CodecOptions> stored = OptionsToStore(pool.options, c);
  if (!stored.ok()) return stored.status();
  const std::string options = FormatCodecOptions(*stored) + FormatPoolTransform(pool.transform);
  const int64_t header = (kPoolFixedHeaderBytes + options.size() + 63) / 64 * 64;
  std::string out(header + g.layer_stride * pool.layers.size(), '\0');
  std::memcpy(&out[0], kPoolMagic, 8);
  PutU32(&out, 8, kPoolVersion);
  PutU32(&out, 12, static_cast<uint32_t>(header));
  PutU32(&out, 16, static_cast<uint32_t>(pool.layers.size()));
  PutU32(&out, 20, static_cast<uint32_t>(pool.tokens));
  PutU32(&out, 24, c.kv_heads());
  PutU32(&out, 28, c.head_dim());
  PutU32(&out, 32, static_cast<uint32_t>(compressed));
  PutU32(&out, 36, c.block_tokens());
  PutU32(&out, 40, static_cast<uint32_t>(c.key_stride()));
  PutU32(&out, 44, static_cast<uint32_t>(c.value_stride()));
  PutU32(&out, 48, static_cast<uint32_t>(c.side_stride()));
  PutU32(&out, 52, static_cast<uint32_t>(options.size()));
  PutU64(&out, 56, static_cast<uint64_t>(g.layer_stride));
  uint16_t kf[16], vf[16];
  Frequencies(c, kf, vf);
  for (int m = 0; m < 16; ++m) {
    out[64 + 2 * m] = static_cast<char>(kf[m]);
    out[65 + 2 * m] = static_cast<char>(kf[m] >> 8);
    out[96 + 2 * m] = static_cast<char>(vf[m]);
    out[97 + 2 * m] = static_cast<char>(vf[m] >> 8);
  }
  std::memcpy(&out[kPoolFixedHeaderBytes], options.data(), options.size());
  for (size_t l = 0; l < pool.layers.size(); ++l) {
    const EncodedLayer& e = pool.layers[l];
    if (e.compressed != compressed || e.compressed + e.window != pool.tokens) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has a different token split"));
    }
    char* p = &out[header + l * g.layer_stride];
    auto put = [&p](const void* src, size_t bytes) {
      if (bytes) std::memcpy(p, src, bytes);
      p += bytes;
    };
    put(e.key_records.data(), e.key_records.size());
    put(e.value_records.data(), e.value_records.size());
    put(e.side.data(), e.side.size());
    put(e.window_keys.data(), 2 * e.window_keys.size());
    put(e.window_values.data(), 2 * e.window_values.size());
  }
  return out;
}

absl::StatusOr<Pool> ParsePool(const std::string& bytes) {
  if (bytes.size() < static_cast<size_t>(kPoolFixedHeaderBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool file of ", bytes.size(), " bytes is shorter than its 128-byte header"));
  }
  if (std::memcmp(bytes.data(), kPoolMagic, 8) != 0) {
    return absl::InvalidArgumentError("not a driftkv pool file (bad magic)");
  }
  const uint32_t version = GetU32(bytes, 8);
  if (version < 1 || version > kPoolVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool file version ", version, " is not supported (this build reads 1 to ", kPoolVersion, ")"));
  }
  const uint64_t header = GetU32(bytes, 12);
  const uint32_t options_bytes = GetU32(bytes, 52);
  if (kPoolFixedHeaderBytes + static_cast<uint64_t>(options_bytes) > header || header > bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool header size ", header, " or options size ", options_bytes, " is inconsistent"));
  }
  Pool pool;
  absl::Status st =
      ParseOptionsText(bytes.substr(kPoolFixedHeaderBytes, options_bytes), &pool.options, &pool.transform);
  if (st.ok()) st = ResolveStoredPayloads(version, &pool.options);
  if (!st.ok()) return st;
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(pool.options);
  if (!codec.ok()) return codec.status();
  pool.codec = *std::move(codec);
  const KvCodec& c = *pool.codec;
  const uint32_t layers = GetU32(bytes, 16);
  pool.tokens = GetU32(bytes, 20);
  const int64_t compressed = GetU32(bytes, 32);
  struct Field {
    const char* name;
    uint64_t stored, expected;
  } fields[] = {
      {"kv_heads", GetU32(bytes, 24), static_cast<uint64_t>(c.kv_heads())},
      {"head_dim", GetU32(bytes, 28), static_cast<uint64_t>(c.head_dim())},
      {"block_tokens", GetU32(bytes, 36), static_cast<uint64_t>(c.block_tokens())},
      {"key_stride", GetU32(bytes, 40), c.key_stride()},
      {"value_stride", GetU32(bytes, 44), c.value_stride()},
      {"side_stride", GetU32(bytes, 48), c.side_stride()},
  };
  for (const Field& f : fields) {
    if (f.stored != f.expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool header ", f.name, " = ", f.stored, " but the codec of its options has ", f.expected));
    }
  }
  if (compressed > pool.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("compressed tokens ", compressed, " exceed tokens ", pool.tokens));
  }
  uint16_t kf[16], vf[16];
  Frequencies(c, kf, vf);
  for (int m = 0; m < 16; ++m) {
    const uint16_t sk = static_cast<uint16_t>(GetU32(bytes, 64 + 2 * m) & 0xffff);
    const uint16_t sv = static_cast<uint16_t>(GetU32(bytes, 96 + 2 * m) & 0xffff);
    if (sk != kf[m] || sv != vf[m]) {
      return absl::InvalidArgumentError(absl::StrCat("pool frequency table differs from this build's at level ", m,
                                                     " (stored key ", sk, ", value ", sv, ")"));
    }
  }
  const Geometry g = LayerGeometry(c, pool.tokens, compressed);
  if (GetU64(bytes, 56) != static_cast<uint64_t>(g.layer_stride)) {
    return absl::InvalidArgumentError(absl::StrCat("pool layer_stride ", GetU64(bytes, 56), " != ", g.layer_stride));
  }
  const uint64_t want = header + static_cast<uint64_t>(g.layer_stride) * layers;
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool file has ", bytes.size(), " bytes, its header describes ", want));
  }
  const int64_t n = c.n();
  for (uint32_t l = 0; l < layers; ++l) {
    EncodedLayer e;
    e.compressed = compressed;
    e.window = g.window;
    const char* p = bytes.data() + header + l * g.layer_stride;
    auto take = [&p](auto* vec, size_t count) {
      vec->resize(count);
      const size_t b = count * sizeof((*vec)[0]);
      if (b) std::memcpy(vec->data(), p, b);
      p += b;
    };
    take(&e.key_records, compressed * c.key_stride());
    take(&e.value_records, compressed * c.value_stride());
    take(&e.side, g.blocks * c.side_stride());
    take(&e.window_keys, g.window * n);
    take(&e.window_values, g.window * n);
    pool.layers.push_back(std::move(e));
  }
  return pool;
}

absl::Status WritePoolFile(const std::string& path, const Pool& pool) {
  absl::StatusOr<std::string> bytes = SerializePool(pool);
  if (!bytes.ok()) return bytes.status();
  std::ofstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot create ", path));
  f.write(bytes->data(), bytes->size());
  if (!f) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<Pool> ReadPoolFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParsePool(ss.str());
}

}  // namespace driftkv
