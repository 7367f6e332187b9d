#include "kernels/codec_bridge.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"
#include "kernels/promote_table.h"
#include "kernels/transform.h"
#include "wire/half.h"

namespace driftkv {
namespace gpu {

void PackDecodeTable(const RansTable& table, uint32_t out[256]) {
  for (int z = 0; z < 256; ++z) {
    const DecodeEntry e = table.decode[z];
    const uint32_t m = EntrySymbol(e);
    out[z] = EntryFreq(e) | (EntryBias(e) << 8) | (static_cast<uint32_t>(FloatToHalf(static_cast<float>(m))) << 16);
  }
}

std::vector<uint32_t> PromoteDecodeTables(const DQuantCodec& codec) {
  std::vector<uint32_t> t(512);
  auto entry = [](const RansTable& table, uint32_t z) {
    const DecodeEntry e = table.decode[z];
    return PromoteTableEntry(EntryFreq(e), EntryBias(e), EntrySymbol(e));
  };
  for (uint32_t z = 0; z < 256; ++z) {
    t[z] = entry(codec.key_codec().table(), z);
    t[256 + z] = entry(codec.value_codec().table(), z);
  }
  return t;
}

absl::Status MakeEncodeAlphabets(const DQuantCodec& codec, EncodeParams* p) {
  const std::string error = GpuPageLayoutError(codec.page_layout(), PageUse::kEncode);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  p->layout = codec.page_layout();
  auto fill = [](const StreamCodec& sc, EncodeAlphabet* a) {
    const RansTable& t = sc.table();
    a->levels = t.levels;
    a->payload_bytes = sc.payload_bytes();
    a->cheapest = 0;
    a->refit = static_cast<int>(sc.refit());
    for (int m = 0; m < t.levels; ++m) {
      a->freq[m] = t.freq[m];
      a->cum[m] = t.cum[m];
      a->cost_bits[m] = t.cost_bits[m];
      if (t.freq[m] > t.freq[a->cheapest]) a->cheapest = m;
    }
  };
  fill(codec.key_codec(), &p->keys);
  fill(codec.value_codec(), &p->values);
  return absl::OkStatus();
}

std::vector<float> PackTransforms(const TransformSet& set) {
  const size_t d = static_cast<size_t>(set.head_dim), dd = d * d;
  std::vector<float> out(static_cast<size_t>(set.layers) * set.kv_heads * 4 * dd);
  // The codec's per-head Hadamard as a matrix: column k is H e_k
  // (codec/hadamard.h), entries +-1/sqrt(d) taken by sign in double.
  std::vector<double> had(dd);
  {
    std::vector<float> e(d);
    for (size_t k = 0; k < d; ++k) {
      std::fill(e.begin(), e.end(), 0.0f);
      e[k] = 1.0f;
      HadamardHeads(e.data(), 1, static_cast<int>(d));
      for (size_t i = 0; i < d; ++i) had[i * d + k] = (e[i] > 0 ? 1.0 : -1.0) / std::sqrt(static_cast<double>(d));
    }
  }
  for (int l = 0; l < set.layers; ++l) {
    for (int h = 0; h < set.kv_heads; ++h) {
      float* dst = out.data() + (static_cast<size_t>(l) * set.kv_heads + h) * 4 * dd;
      // A[j][i] = T[i][j] for x' = T x; T_K^-1 as stored for q' = T_K^-T q.
      const Mat transposed[3] = {Mat::kKey, Mat::kValue, Mat::kValueInverse};
      const int slot[3] = {kTfKey, kTfValue, kTfOutput};
      for (int m = 0; m < 3; ++m) {
        const float* src = set.matrix(l, h, transposed[m]);
        for (size_t i = 0; i < d; ++i) {
          for (size_t j = 0; j < d; ++j) dst[slot[m] * dd + j * d + i] = src[i * d + j];
        }
      }
      // Query: M = H T_K^-T, M[i][j] = sum_k H[i][k] T_K^-1[j][k], in double;
      // stored as A[j][i] = M[i][j].
      const float* kinv = set.matrix(l, h, Mat::kKeyInverse);
      for (size_t i = 0; i < d; ++i) {
        for (size_t j = 0; j < d; ++j) {
          double m = 0.0;
          for (size_t k = 0; k < d; ++k) m += had[i * d + k] * kinv[j * d + k];
          dst[kTfQuery * dd + j * d + i] = static_cast<float>(m);
        }
      }
    }
  }
  return out;
}

void SetPromoteCodec(const DQuantCodec& codec, const uint32_t* tables_dev, PromoteParams* p) {
  p->tables_dev = tables_dev;
  p->key_payload = codec.key_codec().payload_bytes();
  p->value_payload = codec.value_codec().payload_bytes();
}

void SetDemoteTables(const DQuantCodec& codec, DemoteParams* p) {
  auto fill = [](const StreamCodec& sc, DemoteTable* t) {
    const RansTable& r = sc.table();
    *t = DemoteTable();
    t->levels = r.levels;
    t->payload = sc.payload_bytes();
    for (int m = 0; m < 16; ++m) t->step[m] = m < r.levels ? r.encode[m] : MakeRansEncodeEntry(1, 0);
  };
  fill(codec.key_codec(), &p->keys);
  fill(codec.value_codec(), &p->values);
}

}  // namespace gpu
}  // namespace driftkv
