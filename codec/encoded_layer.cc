#include "codec/encoded_layer.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "wire/half.h"

namespace driftkv {

absl::Status EncodeLayer(const KvCodec& codec, const float* keys, const float* values, int64_t tokens, int64_t window,
                         int threads, EncodedLayer* out, CodecStats* stats) {
  if (window < 0 || window > tokens) {
    return absl::InvalidArgumentError(absl::StrCat("residual window ", window, " out of range [0, ", tokens, "]"));
  }
  const int64_t n = codec.n();
  const int bt = codec.block_tokens();
  EncodedLayer layer;
  layer.compressed = tokens - window;
  layer.window = window;
  layer.key_records.resize(layer.compressed * codec.key_stride());
  layer.value_records.resize(layer.compressed * codec.value_stride());
  layer.side.resize(layer.blocks(bt) * codec.side_stride());
  const int64_t blocks = layer.blocks(bt);
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, blocks)));
  std::vector<absl::Status> status(blocks);
  std::vector<CodecStats> block_stats(blocks);
  auto work = [&](int worker) {
    CodecScratch scratch;
    for (int64_t b = worker; b < blocks; b += threads) {
      const int64_t t0 = b * bt;
      const int count = static_cast<int>(std::min<int64_t>(bt, layer.compressed - t0));
      status[b] = codec.EncodeBlock(
          keys + t0 * n, values + t0 * n, count, layer.key_records.data() + t0 * codec.key_stride(),
          layer.value_records.data() + t0 * codec.value_stride(),
          codec.side_stride() ? layer.side.data() + b * codec.side_stride() : nullptr, &scratch, &block_stats[b]);
    }
  };
  if (threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w) pool.emplace_back(work, w);
    for (auto& t : pool) t.join();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (!status[b].ok()) {
      return absl::InvalidArgumentError(absl::StrCat("block starting at token ", b * bt, ": ", status[b].message()));
    }
    if (stats) stats->Add(block_stats[b]);
  }
  layer.window_keys.resize(window * n);
  layer.window_values.resize(window * n);
  for (int64_t i = 0; i < window * n; ++i) {
    layer.window_keys[i] = FloatToBf16(keys[layer.compressed * n + i]);
    layer.window_values[i] = FloatToBf16(values[layer.compressed * n + i]);
  }
  *out = std::move(layer);
  return absl::OkStatus();
}

absl::Status DecodeLayer(const KvCodec& codec, const EncodedLayer& layer, float* keys, float* values) {
  const int64_t n = codec.n();
  const int bt = codec.block_tokens();
  CodecScratch scratch;
  absl::Status result;
  for (int64_t b = 0; b < layer.blocks(bt); ++b) {
    const int64_t t0 = b * bt;
    const int count = static_cast<int>(std::min<int64_t>(bt, layer.compressed - t0));
    absl::Status st = codec.DecodeBlock(layer.key_records.data() + t0 * codec.key_stride(),
                                        layer.value_records.data() + t0 * codec.value_stride(),
                                        codec.side_stride() ? layer.side.data() + b * codec.side_stride() : nullptr,
                                        count, keys + t0 * n, values + t0 * n, &scratch);
    if (!st.ok() && result.ok()) {
      result = absl::DataLossError(absl::StrCat("block starting at token ", t0, ": ", st.message()));
    }
  }
  for (int64_t i = 0; i < layer.window * n; ++i) {
    keys[layer.compressed * n + i] = Bf16ToFloat(layer.window_keys[i]);
    values[layer.compressed * n + i] = Bf16ToFloat(layer.window_values[i]);
  }
  return result;
}

}  // namespace driftkv
