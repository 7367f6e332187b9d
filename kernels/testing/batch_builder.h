// Attention batches for the GPU tests and the benchmark: random KV
// histories encoded with the CPU codec (codec/dquant_codec.h) into pages of
// the layout of kernels/attention.h, with their page tables, windows and
// queries, the model-domain values the references need, and the device copy
// of a batch's items as the AttentionBatch the launchers take.
#ifndef DRIFTKV_KERNELS_TESTING_HOST_POOL_H_
#define DRIFTKV_KERNELS_TESTING_HOST_POOL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/testing/device_buffer.h"

namespace driftkv {
namespace gpu {

// KV of `tokens` tokens, [tokens][kv_heads][head_dim], from the synthetic
// generator (eval/synthetic_kv.h, kind "llm": per-channel key means, so the
// window mean matters, outlier channels, uneven token norms) seeded by the
// next draw of `rng`.
void RandomKv(int tokens, int kv_heads, int head_dim, std::mt19937_64* rng, std::vector<float>* keys,
              std::vector<float>* values);

struct HostDQuantBatch {
  PageLayout layout;
  int q_heads = 0;
  int max_pages = 0;
  std::vector<uint8_t> pool;  // pages, page_bytes each
  std::vector<int32_t> page_table;
  std::vector<int32_t> page_start;           // [items]
  std::vector<int32_t> tokens;               // [items] compressed tokens
  std::vector<int32_t> window_tokens;        // [items]
  std::vector<uint16_t> window_k, window_v;  // [items][kMaxWindow][n] bf16
  std::vector<float> query;                  // [items][q_heads][head_dim]
  // Per item, model domain, [tokens + window][n]: the decoded compressed
  // tokens (what the kernel must attend to), then the window as floats.
  std::vector<std::vector<float>> ref_keys, ref_values;
  int items() const { return static_cast<int>(tokens.size()); }
};

// Encodes one random history per item (compressed tokens[i], window[i] <=
// kMaxWindow) into pages; with shuffle, pages are placed in random order.
absl::Status BuildDQuantBatch(const DQuantCodec& codec, int q_heads, const std::vector<int>& tokens,
                              const std::vector<int>& window, bool shuffle, uint64_t seed, HostDQuantBatch* batch);

// CPU reference of item i with codec/compressed_attention.h CompressedAttention (the
// same algorithm in fp32 on the CPU).
absl::Status CpuCompressedAttention(const DQuantCodec& codec, const HostDQuantBatch& b, int item, float softmax_scale,
                                    float* out, float* lse);

struct HostBf16Batch {
  int kv_heads = 0, head_dim = 0, q_heads = 0, max_pages = 0;
  std::vector<uint8_t> pool;
  std::vector<int32_t> page_table, page_start, tokens;
  std::vector<float> query;
  std::vector<std::vector<float>> ref_keys, ref_values;  // bf16 values as floats
  int items() const { return static_cast<int>(tokens.size()); }
};

// Items [first, first + count) of a HostDQuantBatch on the device: page
// table, starts, tokens, windows (every item's at its explicit start
// (first + i) * kMaxWindow of the whole batch's window arrays), queries,
// outputs poisoned with NaN (an unwritten element fails) and a workspace,
// as the AttentionBatch of kernels/attention_batch.h with softmax scale
// 1 / sqrt(head_dim). The pool is not part of it: the caller uploads the
// pages it attends (cold, or promoted to level pages with the same ids).
class DeviceItems {
 public:
  // False when an allocation or a copy failed.
  bool Upload(const HostDQuantBatch& b, int first, int count);
  const AttentionBatch& batch() const { return batch_; }
  // out [count][q_heads][head_dim] and lse [count][q_heads] after a launch.
  bool Download(std::vector<float>* out, std::vector<float>* lse) const;

 private:
  DeviceBuffer table_, start_, tokens_, window_k_, window_v_, window_tokens_, window_start_, query_, out_, lse_,
      workspace_;
  AttentionBatch batch_;
};

void BuildBf16Batch(int kv_heads, int head_dim, int q_heads, const std::vector<int>& tokens, bool shuffle,
                    uint64_t seed, HostBf16Batch* batch);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_TESTING_HOST_POOL_H_
