// THE description of one decode-attention launch over paged KV, shared by
// the kernels on cold D-Quant pages (kernels/attention.h) and on hot level
// pages (kernels/level_attention.h): a caller builds one AttentionBatch and
// hands it to whichever launcher the pages need; what differs between the
// two (the pool, its layout, the decode tables) sits beside it in each
// launcher's Params.
//
// ITEMS. An item is one (sequence, layer, query token). Item i owns the
// page ids page_table_dev[page_start_dev[i] .. page_start_dev[i] + pages_i),
// pages_i = ceil(tokens_dev[i] / kPageTokens); every page but the last is
// full. The table is only read through page_start_dev, so it may be a
// longer table that outlives the launch (items need not be packed in it).
//
// WINDOW. An item may also carry the newest window_tokens_dev[i] <=
// kMaxWindow tokens uncompressed, attended after its pages.
//
// RESULTS. out is in the model domain; lse is the natural log of the
// softmax denominator. An item with no tokens at all gets out = 0 and lse =
// -inf, the identity of the log-sum-exp merge (codec/lse_merge.h).
//
// MEMORY. Every pointer ending in _dev is device memory of the launch's
// device, read (or written: out, lse, workspace) by kernels enqueued on the
// launch's stream, so it must stay valid until that stream has passed the
// launch. Element types are as declared: int32 tables, bf16 bits as
// uint16, f32 queries and results. Sizes without _dev are host values.
#ifndef DRIFTKV_KERNELS_ATTENTION_BATCH_H_
#define DRIFTKV_KERNELS_ATTENTION_BATCH_H_

#include <cstdint>

namespace driftkv {
namespace gpu {

// Tokens of a page (cold and hot pages alike; also the D-Quant key-mean
// window, so a cold page carries exactly one mean record).
constexpr int kPageTokens = 128;
// The service keeps up to window_tokens + page_tokens - 1 = 255 bf16 tokens
// per (sequence, layer) with the defaults; the merge kernel scores them
// kMergeThreads at a time.
constexpr int kMaxWindow = 256;

// Where an item's answer goes instead of its rows of AttentionBatch's
// out_dev / lse_dev (memory the device addresses: a client's CUDA IPC
// buffer, or pinned or page-locked host memory): the output
// [q_heads][head_dim] at `out` in out_dtype (3: f32; 1: bf16, rounded to
// nearest even exactly as wire/half.h FloatToBf16), and the lse [q_heads]
// f32 at `lse` when not null. A null `out`: the rows, as without targets.
struct OutputTarget {
  void* out = nullptr;
  float* lse = nullptr;
  int32_t out_dtype = 3;
  int32_t reserved = 0;
};

struct AttentionBatch {
  int items = 0;      // >= 1
  int q_heads = 0;    // a multiple of the pool's kv_heads
  int max_pages = 0;  // max over items of pages_i (sizes the split-KV grid)

  // Pages: int32 page ids of the launcher's pool, and per item [items] the
  // first index into the table and the number of tokens in pages.
  const int32_t* page_table_dev = nullptr;
  const int32_t* page_start_dev = nullptr;  // [items]
  const int32_t* tokens_dev = nullptr;      // [items]

  // The bf16 window, [token][kv_head][head_dim] bf16 bits per item. All four
  // may be null when no item has a window (window_tokens_dev null: none).
  // Item i's window starts at token window_start_dev[i] of window_k/v_dev
  // (windows packed back to back, or slots of a device-resident cache), or
  // at token i * kMaxWindow when window_start_dev is null.
  const uint16_t* window_k_dev = nullptr;
  const uint16_t* window_v_dev = nullptr;
  const int32_t* window_tokens_dev = nullptr;  // [items] or null
  const int32_t* window_start_dev = nullptr;   // [items] or null

  // Queries and results, f32, model domain.
  const float* query_dev = nullptr;  // [items][q_heads][head_dim]
  float softmax_scale = 0.0f;        // host value, usually 1 / sqrt(head_dim)
  float* out_dev = nullptr;          // [items][q_heads][head_dim]
  float* lse_dev = nullptr;          // [items][q_heads]
  // Optional, [items]: answers written where the client wants them by the
  // launch's last kernel (the merge), with no launch of their own.
  const OutputTarget* out_targets_dev = nullptr;

  // Split-KV partial states (and, with transforms, the transformed queries):
  // AttentionWorkspaceBytes(items, q_heads, head_dim, max_pages) bytes,
  // 4-byte aligned. Overwritten by every launch.
  void* workspace_dev = nullptr;

  // WUSH-KV (kernels/transform.h): null transforms_dev for the codec's
  // Hadamard rotation. Otherwise the pages hold T_K k and T_V v (codec
  // rotation "identity"): the launcher maps each item's query to
  // q' = T_K^-T q for the pages (in the workspace), the merge maps the
  // pages' output back with T_V^-1 (skipped when values_folded) and attends
  // the window, which is in the model domain, with the query as given.
  const float* transforms_dev = nullptr;  // device form, [layers][kv_heads][4][D][D] f32
  int transform_layers = 0;
  const int32_t* layer_dev = nullptr;  // [items], each in [0, transform_layers)
  bool values_folded = false;
};

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_ATTENTION_BATCH_H_
