#include "kernels/testing/batch_builder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "eval/synthetic_kv.h"
#include "wire/half.h"

namespace driftkv {
namespace gpu {

void RandomKv(int tokens, int kv_heads, int head_dim, std::mt19937_64* rng, std::vector<float>* keys,
              std::vector<float>* values) {
  SynthKv kv = SynthLayer(tokens, kv_heads, head_dim, (*rng)());
  *keys = std::move(kv.keys);
  *values = std::move(kv.values);
}

absl::Status BuildDQuantBatch(const DQuantCodec& codec, int q_heads, const std::vector<int>& tokens,
                              const std::vector<int>& window, bool shuffle, uint64_t seed, HostDQuantBatch* b) {
  b->layout = codec.page_layout();
  const std::string error = GpuPageLayoutError(b->layout, PageUse::kAttend);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  absl::Status st;
  const PageLayout& lay = b->layout;
  const int n = lay.n(), d = lay.head_dim, items = static_cast<int>(tokens.size());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  b->q_heads = q_heads;
  b->tokens = std::vector<int32_t>(tokens.begin(), tokens.end());
  b->window_tokens = std::vector<int32_t>(window.begin(), window.end());
  b->page_start.resize(items);
  int total_pages = 0;
  b->max_pages = 0;
  for (int i = 0; i < items; ++i) {
    if (window[i] < 0 || window[i] > kMaxWindow) {
      return absl::InvalidArgumentError(absl::StrCat("window ", window[i], " out of range"));
    }
    const int pages = (tokens[i] + kPageTokens - 1) / kPageTokens;
    b->page_start[i] = total_pages;
    total_pages += pages;
    b->max_pages = std::max(b->max_pages, pages);
  }
  std::vector<int32_t> perm(total_pages);
  std::iota(perm.begin(), perm.end(), 0);
  if (shuffle) std::shuffle(perm.begin(), perm.end(), rng);
  b->page_table = perm;
  b->pool.assign(static_cast<size_t>(std::max(total_pages, 1)) * lay.page_bytes, 0);
  b->window_k.assign(static_cast<size_t>(items) * kMaxWindow * n, 0);
  b->window_v.assign(static_cast<size_t>(items) * kMaxWindow * n, 0);
  b->query.resize(static_cast<size_t>(items) * q_heads * d);
  for (float& q : b->query) q = normal(rng);
  b->ref_keys.resize(items);
  b->ref_values.resize(items);
  CodecScratch scratch;
  std::vector<float> keys, values;
  for (int i = 0; i < items; ++i) {
    RandomKv(tokens[i] + window[i], lay.kv_heads, lay.head_dim, &rng, &keys, &values);
    std::vector<float>& rk = b->ref_keys[i];
    std::vector<float>& rv = b->ref_values[i];
    rk.resize(static_cast<size_t>(tokens[i] + window[i]) * n);
    rv.resize(rk.size());
    for (int t0 = 0, pg = 0; t0 < tokens[i]; t0 += kPageTokens, ++pg) {
      const int count = std::min(kPageTokens, tokens[i] - t0);
      uint8_t* page = b->pool.data() + static_cast<size_t>(b->page_table[b->page_start[i] + pg]) * lay.page_bytes;
      StreamStats ks, vs;
      st = codec.EncodeWindow(keys.data() + static_cast<size_t>(t0) * n, values.data() + static_cast<size_t>(t0) * n,
                              count, page, page + lay.value_offset, page + lay.mean_offset, &scratch, &ks, &vs);
      if (!st.ok()) return st;
      for (int t = 0; t < count; ++t) {
        st = codec.DecodeKey(page + static_cast<size_t>(t) * lay.key_stride, page + lay.mean_offset,
                             rk.data() + static_cast<size_t>(t0 + t) * n, &scratch);
        if (st.ok()) {
          st = codec.DecodeValue(page + lay.value_offset + static_cast<size_t>(t) * lay.value_stride,
                                 rv.data() + static_cast<size_t>(t0 + t) * n, &scratch);
        }
        if (!st.ok()) return st;
      }
    }
    for (int t = 0; t < window[i]; ++t) {
      for (int j = 0; j < n; ++j) {
        const size_t src = static_cast<size_t>(tokens[i] + t) * n + j;
        const size_t dst = (static_cast<size_t>(i) * kMaxWindow + t) * n + j;
        b->window_k[dst] = FloatToBf16(keys[src]);
        b->window_v[dst] = FloatToBf16(values[src]);
        rk[src] = Bf16ToFloat(b->window_k[dst]);
        rv[src] = Bf16ToFloat(b->window_v[dst]);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuCompressedAttention(const DQuantCodec& codec, const HostDQuantBatch& b, int item, float softmax_scale,
                                    float* out, float* lse) {
  const PageLayout& lay = b.layout;
  std::vector<CompressedBlock> blocks;
  for (int t0 = 0, pg = 0; t0 < b.tokens[item]; t0 += kPageTokens, ++pg) {
    const uint8_t* page = b.pool.data() + static_cast<size_t>(b.page_table[b.page_start[item] + pg]) * lay.page_bytes;
    CompressedBlock blk;
    blk.key_records = page;
    blk.value_records = page + lay.value_offset;
    blk.mean_record = page + lay.mean_offset;
    blk.tokens = std::min(kPageTokens, b.tokens[item] - t0);
    blocks.push_back(blk);
  }
  Bf16Tokens win;
  const size_t off = static_cast<size_t>(item) * kMaxWindow * lay.n();
  win.keys = b.window_k.data() + off;
  win.values = b.window_v.data() + off;
  win.tokens = b.window_tokens[item];
  AttentionScratch scratch;
  return CompressedAttention(codec, blocks, win, b.query.data() + static_cast<size_t>(item) * b.q_heads * lay.head_dim,
                             b.q_heads, softmax_scale, out, lse, &scratch);
}

bool DeviceItems::Upload(const HostDQuantBatch& b, int first, int count) {
  const int d = b.layout.head_dim;
  const size_t qd = static_cast<size_t>(b.q_heads) * d;
  const std::vector<int32_t> start(b.page_start.begin() + first, b.page_start.begin() + first + count);
  const std::vector<int32_t> tokens(b.tokens.begin() + first, b.tokens.begin() + first + count);
  const std::vector<int32_t> wt(b.window_tokens.begin() + first, b.window_tokens.begin() + first + count);
  std::vector<int32_t> wstart(count);
  for (int i = 0; i < count; ++i) wstart[i] = (first + i) * kMaxWindow;
  const std::vector<float> q(b.query.begin() + first * qd, b.query.begin() + (first + count) * qd);
  int max_pages = 0;
  for (int t : tokens) max_pages = std::max(max_pages, (t + kPageTokens - 1) / kPageTokens);
  if (!(table_.Upload(b.page_table) && start_.Upload(start) && tokens_.Upload(tokens) && window_k_.Upload(b.window_k) &&
        window_v_.Upload(b.window_v) && window_tokens_.Upload(wt) && window_start_.Upload(wstart) && query_.Upload(q) &&
        out_.Resize(count * qd * 4) && lse_.Resize(static_cast<size_t>(count) * b.q_heads * 4) &&
        workspace_.Resize(AttentionWorkspaceBytes(count, b.q_heads, d, std::max(1, max_pages))))) {
    return false;
  }
  if (cudaMemset(out_.get<void>(), 0xff, out_.bytes()) != cudaSuccess ||
      cudaMemset(lse_.get<void>(), 0xff, lse_.bytes()) != cudaSuccess) {
    return false;
  }
  batch_ = AttentionBatch{};
  batch_.items = count;
  batch_.q_heads = b.q_heads;
  batch_.max_pages = max_pages;
  batch_.page_table_dev = table_.get<int32_t>();
  batch_.page_start_dev = start_.get<int32_t>();
  batch_.tokens_dev = tokens_.get<int32_t>();
  batch_.window_k_dev = window_k_.get<uint16_t>();
  batch_.window_v_dev = window_v_.get<uint16_t>();
  batch_.window_tokens_dev = window_tokens_.get<int32_t>();
  batch_.window_start_dev = window_start_.get<int32_t>();
  batch_.query_dev = query_.get<float>();
  batch_.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  batch_.out_dev = out_.get<float>();
  batch_.lse_dev = lse_.get<float>();
  batch_.workspace_dev = workspace_.get<void>();
  return true;
}

bool DeviceItems::Download(std::vector<float>* out, std::vector<float>* lse) const {
  return out_.Download(out) && lse_.Download(lse);
}

void BuildBf16Batch(int kv_heads, int head_dim, int q_heads, const std::vector<int>& tokens, bool shuffle,
                    uint64_t seed, HostBf16Batch* b) {
  const int n = kv_heads * head_dim, items = static_cast<int>(tokens.size());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  b->kv_heads = kv_heads;
  b->head_dim = head_dim;
  b->q_heads = q_heads;
  b->tokens = std::vector<int32_t>(tokens.begin(), tokens.end());
  b->page_start.resize(items);
  int total = 0;
  b->max_pages = 0;
  for (int i = 0; i < items; ++i) {
    const int pages = (tokens[i] + kPageTokens - 1) / kPageTokens;
    b->page_start[i] = total;
    total += pages;
    b->max_pages = std::max(b->max_pages, pages);
  }
  b->page_table.resize(total);
  std::iota(b->page_table.begin(), b->page_table.end(), 0);
  if (shuffle) std::shuffle(b->page_table.begin(), b->page_table.end(), rng);
  const size_t page_bytes = Bf16PageBytes(kv_heads, head_dim);
  // Unused slots of a last page hold NaN: the kernel must never read them into a result.
  b->pool.assign(static_cast<size_t>(std::max(total, 1)) * page_bytes, 0xff);
  b->query.resize(static_cast<size_t>(items) * q_heads * head_dim);
  for (float& q : b->query) q = normal(rng);
  b->ref_keys.resize(items);
  b->ref_values.resize(items);
  std::vector<float> keys, values;
  for (int i = 0; i < items; ++i) {
    RandomKv(tokens[i], kv_heads, head_dim, &rng, &keys, &values);
    b->ref_keys[i].resize(keys.size());
    b->ref_values[i].resize(values.size());
    for (int t = 0; t < tokens[i]; ++t) {
      uint16_t* page = reinterpret_cast<uint16_t*>(
          b->pool.data() + static_cast<size_t>(b->page_table[b->page_start[i] + t / kPageTokens]) * page_bytes);
      for (int j = 0; j < n; ++j) {
        const size_t src = static_cast<size_t>(t) * n + j;
        const uint16_t kb = FloatToBf16(keys[src]), vb = FloatToBf16(values[src]);
        page[static_cast<size_t>(t % kPageTokens) * n + j] = kb;
        page[static_cast<size_t>(kPageTokens + t % kPageTokens) * n + j] = vb;
        b->ref_keys[i][src] = Bf16ToFloat(kb);
        b->ref_values[i][src] = Bf16ToFloat(vb);
      }
    }
  }
}

}  // namespace gpu
}  // namespace driftkv
