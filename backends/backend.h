// The compute backend of the service: encodes pages, decodes tokens and runs
// batched decode attention over pages of a PagePool plus bf16 windows.
//
// The handler owns all state and locking; a backend is stateless between
// calls apart from caches it keeps for itself, and its methods may be called
// concurrently from many RPC threads (on disjoint pages when writing).
// Pointers are host memory: the CPU backend computes in place; a device
// backend (CUDA, backends/cuda/) mirrors the arena on the device and uses
// the same page ids and layout (see page_pool.h). Backends are made by name
// through backends/registry.h; each lives in its own folder below backends/
// with its own registration target.
#ifndef DRIFTKV_BACKENDS_BACKEND_H_
#define DRIFTKV_BACKENDS_BACKEND_H_

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backends/attend_route.h"
#include "backends/page_checksum.h"
#include "backends/page_pool.h"
#include "backends/pending_checksums.h"
#include "codec/compressed_attention.h"
#include "codec/kv_codec.h"
#include "codec/transform/transforms_file.h"
#include "wire/status_handover.h"

namespace driftkv {

// TRANSFORMS. With BackendArgs::transforms set (WUSH-KV) the codec
// was built with rotation "identity" and the backend owns the transform
// stage of codec/transform/transform.h, using layer `layer` of the set: keys are
// stored as T_K k and values as T_V v (values untouched when values_folded);
// DecodeTokens returns the model domain (T^-1 applied); Attend scores the
// pages with q' = T_K^-T q, maps the pages' output back with T_V^-1 and
// attends the bf16 window (model domain) with q itself, merging the two by
// their log-sum-exp (codec/transform/transform_attention.h). Without transforms the
// layer fields are ignored.

// HOT TIER. When the service runs a hot tier (BackendArgs::hot_pool set), a
// layer's pages live in exactly one of two pools: the cold pool of D-Quant
// pages (codec/page_layout.h) or the hot pool of level pages of the same
// symbols stored fixed-width (codec/level_page.h). The handler decides; the
// backend moves pages between the pools, exactly:
//   PromotePages: cold page `from` -> hot page `to` (the symbols decoded
//                 from the rANS records); the cold page is left as it is and
//                 the caller frees it afterwards.
//   DemotePages:  hot page `from` -> cold page `to`, byte-identical to the
//                 cold page it was promoted from (rANS of the known levels,
//                 no drift search); the caller frees the hot page afterwards.
// AttendJob::hot says which pool a job's pages are in; DecodeHotTokens reads
// hot pages. Read and Attend give the same answer from either tier.
struct TierMove {
  PageId from = -1;
  PageId to = -1;
  int tokens = 0;  // tokens the page holds (page_tokens for full pages)
};

// Encode P = page_tokens tokens into one page.
struct EncodeJob {
  const float* keys = nullptr;    // [P][kv_heads][head_dim], host
  const float* values = nullptr;  // same shape
  PageId page = -1;
  int layer = 0;     // selects the transform; see TRANSFORMS
  CodecStats stats;  // out: this page's stream statistics
  // out, optional: each stream's rANS bytes used / payload bytes, keys and
  // values (P each); a backend that leaves them empty reports only `stats`.
  std::vector<float> key_utilization, value_utilization;
};

// DEVICE INGEST (docs/nccl.md). Tokens that a transport receives straight
// into memory the backend's encoder reads (the GPU's for cuda, the host's
// for cpu) are stored without a host copy of the raw KV: the transport
// receives into a StagingBuffer, CheckStaged validates the values,
// EncodeStaged encodes the pages from there. Only the bf16 window (fewer
// than R + P tokens per layer, which lives in host memory by design) is
// copied to the host.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
};

// Keys and values of `tokens` tokens, [tokens][kv_heads][head_dim] each, in
// a wire dtype (proto DType: bf16, fp16, f32), in staging memory.
struct StagedTokens {
  const void* keys = nullptr;
  const void* values = nullptr;
  int dtype = 0;
  int64_t tokens = 0;
};

// One decode-attention item.
struct AttendJob {
  absl::Span<const PageId> pages;  // full pages, oldest first
  Bf16Tokens window;               // the newest tokens, after the pages
  // Names the window's content for backends that keep windows on the
  // device between calls: window_id is nonzero and unique to one (sequence,
  // layer) for the process's life, window_first is the absolute index of
  // window.keys[0] in that layer. A stored token never changes, so (id,
  // first, tokens) determines the content. 0: nothing to cache.
  uint64_t window_id = 0;
  int64_t window_first = 0;
  const float* query = nullptr;  // [q_heads][head_dim]
  int q_heads = 0;
  float softmax_scale = 0.0f;
  int layer = 0;         // selects the transform; see TRANSFORMS
  bool hot = false;      // `pages` are level pages of the hot pool; see HOT TIER
  float* out = nullptr;  // [q_heads][head_dim]
  float* lse = nullptr;  // [q_heads]
  // CLIENT MEMORY: with query_dev set the query is read from there instead
  // of `query`, and with out_dev set the output and lse are written there
  // instead of out/lse (both or neither of out_dev and lse_dev). See
  // Backend::AddressesClientMemory.
  const void* query_dev = nullptr;  // [q_heads][head_dim] in query_dtype
  int query_dtype = 3;              // proto DType: bf16 1, fp16 2, f32 3
  void* out_dev = nullptr;          // [q_heads][head_dim] in out_dtype
  int out_dtype = 3;                // f32 3 or bf16 1
  float* lse_dev = nullptr;         // [q_heads] f32
  // With check_query, the backend checks the query (at query_dev, or
  // `query`) as it reads it and sets query_bad to the index of a
  // non-finite element (-1: none); the output, written where it goes, is
  // then meaningless. The handler asks for it only where no state changes
  // with the call (it has no decode step), so one pass over the query (on
  // the CUDA backend, the launch's own gather) both checks and reads it.
  bool check_query = false;
  int64_t query_bad = -1;                        // out
  AttendRoute route = AttendRoute::kUnreported;  // out, set with an OK status
  absl::Status status;                           // out
};

// A job's out fields from the copy of it that a backend ran (batching and
// device-splitting wrappers run copies). The status is copied unshared:
// the calls of one batch return on different threads.
inline void CopyAttendOutcome(const AttendJob& ran, AttendJob* job) {
  job->status = UnsharedStatus(ran.status);
  job->query_bad = ran.query_bad;
  job->route = ran.route;
}

// CLIENT MEMORY. A read of one client tensor the device addresses
// (Backend::ReadClientTensors): `elements` values of `dtype` at `src_dev`,
// converted to float into `host` (null: only checked); `bad` is set to the
// index of the first non-finite value, or -1.
struct ClientRead {
  const void* src_dev = nullptr;
  int dtype = 3;
  int elements = 0;
  float* host = nullptr;
  // An element of |x| above it is bad, as a non-finite one is (a query's:
  // kQueryLimit of wire/tensor.h).
  float limit = std::numeric_limits<float>::max();
  int64_t bad = -1;  // out
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Encodes every job; returns the first failure (InvalidArgument naming the
  // token). Pages of failed jobs hold garbage; the caller frees them.
  virtual absl::Status EncodePages(absl::Span<EncodeJob> jobs) = 0;

  // Reconstructs tokens [first, first + count) of a page of layer `layer`
  // into float [count][kv_heads][head_dim] arrays (model domain). DataLoss
  // on a corrupt record.
  virtual absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) = 0;

  // Runs every job; each job's status says how it went. A batch may mix hot
  // and cold jobs.
  virtual void Attend(absl::Span<AttendJob> jobs) = 0;

  // The hot tier (see HOT TIER); a backend without one returns Unimplemented.
  virtual bool SupportsHotTier() const { return false; }
  virtual absl::Status PromotePages(absl::Span<const TierMove> moves) {
    return absl::UnimplementedError(name() + " backend has no hot tier");
  }
  // PromotePages with the checksums (INTEGRITY) around it, in one round
  // trip where the backend can: cold_sums[i] of page moves[i].from of
  // `cold` as the move read it, hot_sums[i] of page moves[i].to of `hot`
  // after it. The caller commits the move only when cold_sums match what
  // it stored. cold_sums are filled whenever the call returns OK or the
  // DATA_LOSS of a page that did not decode.
  virtual absl::Status PromotePagesChecked(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                           PageChecksum* cold_sums, PageChecksum* hot_sums) {
    std::vector<PageId> from(moves.size()), to(moves.size());
    for (size_t i = 0; i < moves.size(); ++i) {
      from[i] = moves[i].from;
      to[i] = moves[i].to;
    }
    absl::Status st = ChecksumPages(cold, from, cold_sums);
    if (st.ok()) st = PromotePages(moves);
    if (st.ok()) st = ChecksumPages(hot, to, hot_sums);
    return st;
  }
  // PromotePagesChecked whose level sums may come later: a backend that can
  // return before it has summed the level pages (they are still summed
  // from the bytes it holds once the pages are written) sets *later to
  // them and leaves hot_sums alone; otherwise *later stays null and
  // hot_sums is filled as PromotePagesChecked fills it. cold_sums and the
  // status are as PromotePagesChecked's either way.
  virtual absl::Status PromotePagesCheckedLater(absl::Span<const TierMove> moves, const PagePool& cold,
                                                const PagePool& hot, PageChecksum* cold_sums, PageChecksum* hot_sums,
                                                std::shared_ptr<PendingChecksums>* later) {
    later->reset();
    return PromotePagesChecked(moves, cold, hot, cold_sums, hot_sums);
  }
  // A hot layer's new pages, encoded straight into the hot pool: jobs[i]'s
  // tokens become level page hot_pages[i] of `hot`, byte for byte the page
  // PromotePages makes of the cold page EncodePages writes; cold_sums[i]
  // gets that cold page's checksum as ChecksumPages would report it (what
  // a demotion must give back), hot_sums[i] the level page's. jobs[i].page
  // is a page of `cold` the caller reserved, which the backend may use as
  // scratch (its bytes afterwards are unspecified; the caller frees it).
  // Same failures as EncodePages. The default encodes, then promotes with
  // PromotePagesChecked.
  virtual absl::Status EncodeLevelPages(absl::Span<EncodeJob> jobs, absl::Span<const PageId> hot_pages,
                                        const PagePool& cold, const PagePool& hot, PageChecksum* cold_sums,
                                        PageChecksum* hot_sums) {
    absl::Status st = EncodePages(jobs);
    if (!st.ok()) return st;
    std::vector<TierMove> moves(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) moves[i] = TierMove{jobs[i].page, hot_pages[i], cold.page_tokens()};
    return PromotePagesChecked(moves, cold, hot, cold_sums, hot_sums);
  }
  virtual absl::Status DemotePages(absl::Span<const TierMove> moves) {
    return absl::UnimplementedError(name() + " backend has no hot tier");
  }
  // DecodeTokens for a page of the hot pool.
  virtual absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) {
    return absl::UnimplementedError(name() + " backend has no hot tier");
  }

  // INTEGRITY (backends/page_checksum.h). sums[i] = CRC-32C of page
  // pages[i] of `pool` (the cold pool or the hot pool) as this backend holds
  // it for attention and for moves between the tiers: the host pool's bytes
  // for a backend that computes on the host pool (the default, cpu); the
  // device arena's copy for one that mirrors it (cuda: summed on the
  // device), so a check covers the bytes the kernels read, not a host-side
  // shadow. `sums` holds pages.size() entries.
  virtual absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) {
    for (size_t i = 0; i < pages.size(); ++i) sums[i] = Crc32c(pool.page(pages[i]), pool.page_stride());
    return absl::OkStatus();
  }

  // A backend that keeps bf16 windows on its device between calls
  // (AttendJob::window_id) takes these jobs' windows now, so that a later
  // Attend of them (the same id, first token and tokens) uploads nothing:
  // Prefetch. Reads only the jobs' window, window_id, window_first and
  // pages (which device). Best effort: windows it cannot place are left
  // for the Attend. Default: nothing to do.
  virtual absl::Status CacheWindows(absl::Span<const AttendJob> jobs) { return absl::OkStatus(); }

  // The caller wrote these cold pages' bytes in the host pool itself (the
  // handler restoring a snapshot, service/snapshot_file.h); a backend that
  // mirrors the arena copies them to its mirror. The CPU backend computes
  // on the host pool and has nothing to do.
  virtual absl::Status UploadPages(absl::Span<const PageId> pages) { return absl::OkStatus(); }

  // THE HOST LEVEL (docs/tiers.md, service/spill_tier.h): whole cold pages
  // of `pool` copied to and from host memory below it (slots that
  // PinHostRegion pinned, so a device backend copies them straight).
  // PagesToHost: dst[i] <- page pages[i] as this backend holds it.
  // PagesFromHost: page pages[i] <- src[i] in every copy the backend keeps
  // (cuda: the device arena and the host pool), then sums[i] = its
  // CRC-32C as ChecksumPages reports it, for the caller to check before it
  // serves the page. The defaults copy on the host, then UploadPages and
  // ChecksumPages. Each span holds pages.size() entries.
  virtual absl::Status PagesToHost(const PagePool& pool, absl::Span<const PageId> pages,
                                   absl::Span<uint8_t* const> dst) {
    for (size_t i = 0; i < pages.size(); ++i) std::memcpy(dst[i], pool.page(pages[i]), pool.page_stride());
    return absl::OkStatus();
  }
  virtual absl::Status PagesFromHost(const PagePool& pool, absl::Span<const uint8_t* const> src,
                                     absl::Span<const PageId> pages, PageChecksum* sums) {
    for (size_t i = 0; i < pages.size(); ++i) std::memcpy(pool.page(pages[i]), src[i], pool.page_stride());
    if (absl::Status st = UploadPages(pages); !st.ok()) return st;
    return ChecksumPages(pool, pages, sums);
  }

  // CLIENT MEMORY (service/attend_io.h). True when Attend reads
  // AttendJob::query_dev and writes out_dev/lse_dev: pointers the backend's
  // device addresses (a decode worker's buffer opened by CUDA IPC, or
  // client host memory the backend page-locked and mapped). The tensors
  // are moved by one gather before the attention kernel, and the merge
  // writes the answers in place, with the same conversions as the inline
  // path, so answers are bit-identical. A backend that returns false gets host pointers only.
  virtual bool AddressesClientMemory() const { return false; }
  // Converts and checks client tensors (see ClientRead) in one launch and
  // one synchronisation.
  virtual absl::Status ReadClientTensors(absl::Span<ClientRead> reads) {
    return absl::UnimplementedError(name() + " backend does not address client memory");
  }

  // True when one Attend over many jobs costs much less than several over
  // few (one kernel launch each): the handler then merges concurrent calls
  // (backends/attend_batcher.h).
  virtual bool PrefersBatchedAttend() const { return false; }

  // DEVICE INGEST. The defaults serve host memory (any backend); a device
  // backend overrides all five.
  // The CUDA device whose memory staging buffers are; -1: host memory.
  virtual int staging_device() const { return -1; }
  virtual absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes);
  // Every value finite and |x| <= limit; otherwise InvalidArgument exactly
  // as wire/tensor.h CheckValues words it ("keys element 7 is inf; must be
  // finite"). REQUIRES: t.dtype valid.
  virtual absl::Status CheckStaged(const StagedTokens& t, int n, float limit);
  // The first `count` staged tokens as floats on the host, keys and values
  // [count][n] each (for comparing tokens sent again with stored ones).
  virtual absl::Status CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values);
  // Encodes pages from the token sequence S = [prefix (host bf16,
  // prefix_keys.size() / n tokens); staged tokens [skip, skip + fresh)
  // rounded to bf16]: jobs[i] (page and layer set by the caller, keys and
  // values ignored) gets tokens [i P, (i + 1) P) of S (P = page_tokens),
  // and the rest of S
  // comes back as bf16 in tail_keys/tail_values. Same failures as
  // EncodePages. REQUIRES: CheckStaged passed.
  virtual absl::Status EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                                    absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                                    absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                                    std::vector<uint16_t>* tail_values);

  // MEMORY REGIONS (service/regions.h, docs/api.md "Memory regions").
  // Opens a client's cudaIpcMemHandle_t (`handle`, `handle_bytes` = 64) on
  // CUDA device `device` and returns the device pointer of its base; the
  // region is the first `size` bytes there (the handle carries no size:
  // OutOfRange when the driver reports a smaller allocation). Each
  // successful open is closed by exactly one CloseIpcRegion.
  virtual absl::StatusOr<void*> OpenIpcRegion(const void* handle, size_t handle_bytes, int device, size_t size) {
    return absl::UnimplementedError(name() + " backend has no CUDA IPC regions");
  }
  virtual void CloseIpcRegion(void* dev_ptr) {}
  // Page-locks host memory `p` of `bytes` (a host region) so that copies
  // between it and the device run at full speed; a host-only backend has
  // nothing to do. Each successful pin is undone by one UnpinHostRegion.
  virtual absl::Status PinHostRegion(void* p, size_t bytes) { return absl::OkStatus(); }
  virtual void UnpinHostRegion(void* p) {}
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_BACKEND_H_
