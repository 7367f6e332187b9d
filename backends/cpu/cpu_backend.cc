#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/host_decode.h"
#include "backends/thread_pool.h"
#include "codec/level_attention.h"
#include "codec/level_page.h"
#include "codec/transform/transform.h"
#include "codec/transform/transform_attention.h"
#include "proto/driftkv.pb.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

// Split an item over threads only in runs of at least this many pages, so
// that each part's work outweighs the thread hand-off and the merge.
constexpr size_t kMinPagesPerPart = 8;

class CpuBackend : public Backend {
 public:
  // `layers` (one per model layer) empty: the codec's own rotation.
  // `hot_pool` null: no hot tier; otherwise its pages are level pages of
  // `hot_layout` (MakeCpuBackend checks).
  CpuBackend(const DQuantCodec* codec, const PagePool* pool, int threads, std::vector<LayerTransform> layers,
             bool values_folded, const PagePool* hot_pool = nullptr, LevelPageLayout hot_layout = LevelPageLayout())
      : codec_(*codec),
        pool_(*pool),
        threads_(threads > 0 ? threads : DefaultThreads()),
        layers_(std::move(layers)),
        values_folded_(values_folded),
        hot_pool_(hot_pool),
        hot_layout_(hot_layout),
        workers_(threads_) {}

  std::string name() const override { return "cpu"; }

  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override {
    return ForEachJob(jobs, [&](int i) { return Encode(&jobs[i], nullptr); });
  }

  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    thread_local CodecScratch scratch;
    const LayerTransform* transform = nullptr;
    if (!layers_.empty()) {
      absl::StatusOr<const LayerTransform*> t = Transform(layer);
      if (!t.ok()) return t.status();
      transform = *t;
    }
    return DecodePageTokens(codec_, pool_, page, first, count, transform, values_folded_, keys, values, &scratch);
  }

  // HOT TIER (backends/backend.h): the host pools' pages converted with
  // codec/level_page.h, pages spread over the workers.
  bool SupportsHotTier() const override { return hot_pool_ != nullptr; }

  absl::Status PromotePages(absl::Span<const TierMove> moves) override {
    if (hot_pool_ == nullptr) return Backend::PromotePages(moves);
    return ForEachMove(moves, [&](const TierMove& m) {
      absl::Status st = PromotePage(codec_, hot_layout_, pool_.key_records(m.from), pool_.value_records(m.from),
                                    pool_.mean_record(m.from), m.tokens, hot_pool_->page(m.to));
      return st.ok() ? st : absl::Status(st.code(), absl::StrCat("promoting page ", m.from, ": ", st.message()));
    });
  }

  // The records still go to the reserved cold page, for its checksum; the
  // level page is packed from the encoder's symbols (no rANS decode).
  absl::Status EncodeLevelPages(absl::Span<EncodeJob> jobs, absl::Span<const PageId> hot_pages, const PagePool& cold,
                                const PagePool& hot, PageChecksum* cold_sums, PageChecksum* hot_sums) override {
    if (hot_pool_ == nullptr || &cold != &pool_ || &hot != hot_pool_) {
      return Backend::EncodeLevelPages(jobs, hot_pages, cold, hot, cold_sums, hot_sums);
    }
    absl::Status st = ForEachJob(jobs, [&](int i) { return Encode(&jobs[i], hot_pool_->page(hot_pages[i])); });
    if (!st.ok()) return st;
    std::vector<PageId> pages(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) pages[i] = jobs[i].page;
    st = ChecksumPages(cold, pages, cold_sums);
    if (st.ok()) st = ChecksumPages(hot, hot_pages, hot_sums);
    return st;
  }

  absl::Status DemotePages(absl::Span<const TierMove> moves) override {
    if (hot_pool_ == nullptr) return Backend::DemotePages(moves);
    return ForEachMove(moves, [&](const TierMove& m) {
      absl::Status st = DemotePage(codec_, hot_layout_, hot_pool_->page(m.from), m.tokens, pool_.key_records(m.to),
                                   pool_.value_records(m.to), pool_.mean_record(m.to));
      return st.ok() ? st : absl::Status(st.code(), absl::StrCat("demoting hot page ", m.from, ": ", st.message()));
    });
  }

  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    if (hot_pool_ == nullptr) return Backend::DecodeHotTokens(page, layer, first, count, keys, values);
    thread_local CodecScratch scratch;
    const LayerTransform* transform = nullptr;
    if (!layers_.empty()) {
      absl::StatusOr<const LayerTransform*> t = Transform(layer);
      if (!t.ok()) return t.status();
      transform = *t;
    }
    return DecodeLevelPageTokens(codec_, hot_layout_, hot_pool_->page(page), page, first, count, transform,
                                 values_folded_, keys, values, &scratch);
  }

  // Items run on separate threads. When there are fewer items than threads,
  // a long item is also split over its pages ("split-KV"): each part
  // attends to a contiguous run of pages (the last part also to the bf16
  // window) and the parts' (output, lse) states are merged by
  // MergeAttentionParts (codec/lse_merge.h; an empty part has lse = -inf
  // and weight 0, the identity of the merge). Hot jobs (level pages) are
  // split and merged exactly like cold ones and run LevelAttention, which
  // is bit-identical to CompressedAttention per part: a layer's answer does
  // not depend on its tier.
  void Attend(absl::Span<AttendJob> jobs) override {
    const int d = codec_.config().head_dim;
    for (AttendJob& j : jobs) {
      if (j.check_query)
        j.query_bad = FirstOutOfRange(j.query, v1::DTYPE_F32, static_cast<size_t>(j.q_heads) * d, kQueryLimit);
    }
    struct Part {
      int job = 0;
      size_t first = 0, end = 0;  // pages [first, end)
      bool window = false;
      std::vector<float> out, lse;
      absl::Status status;
    };
    std::vector<Part> parts;
    const int per_job = std::max<int>(1, threads_ / std::max<int>(1, static_cast<int>(jobs.size())));
    for (int j = 0; j < static_cast<int>(jobs.size()); ++j) {
      const size_t pages = jobs[j].pages.size();
      const int n = static_cast<int>(std::max<size_t>(1, std::min<size_t>(per_job, pages / kMinPagesPerPart)));
      for (int k = 0; k < n; ++k) {
        Part p;
        p.job = j;
        p.first = pages * k / n;
        p.end = pages * (k + 1) / n;
        p.window = k == n - 1;
        parts.push_back(std::move(p));
      }
    }
    const bool split = parts.size() > jobs.size();
    for (AttendJob& j : jobs) j.route = j.hot ? AttendRoute::kHot : AttendRoute::kColdHost;
    workers_.ParallelFor(static_cast<int>(parts.size()), [&](int i) {
      thread_local AttentionScratch scratch;
      thread_local std::vector<CompressedBlock> blocks;
      Part& p = parts[i];
      AttendJob& j = jobs[p.job];
      blocks.clear();
      if (!j.hot) {
        for (size_t k = p.first; k < p.end; ++k) blocks.push_back(pool_.block(j.pages[k]));
      }
      float* out = j.out;
      float* lse = j.lse;
      if (split) {
        p.out.resize(static_cast<size_t>(j.q_heads) * codec_.config().head_dim);
        p.lse.resize(j.q_heads);
        out = p.out.data();
        lse = p.lse.data();
      }
      const Bf16Tokens window = p.window ? j.window : Bf16Tokens{};
      if (j.hot) {
        p.status = AttendHot(j, p.first, p.end, window, out, lse);
        return;
      }
      if (layers_.empty()) {
        p.status = CompressedAttention(codec_, blocks, window, j.query, j.q_heads, j.softmax_scale, out, lse, &scratch);
        return;
      }
      // Each part maps its own pages' output back with T_V^-1; the merge
      // below is a convex combination of the parts, so that equals mapping
      // the merged output once.
      absl::StatusOr<const LayerTransform*> t = Transform(j.layer);
      p.status = t.ok() ? TransformedCompressedAttention(codec_, **t, values_folded_, blocks, window, j.query,
                                                         j.q_heads, j.softmax_scale, out, lse, &scratch)
                        : t.status();
    });
    if (!split) {
      for (size_t i = 0; i < parts.size(); ++i) jobs[parts[i].job].status = parts[i].status;
      return;
    }
    for (size_t begin = 0; begin < parts.size();) {
      size_t end = begin;
      while (end < parts.size() && parts[end].job == parts[begin].job) ++end;
      AttendJob& j = jobs[parts[begin].job];
      j.status = absl::OkStatus();
      for (size_t k = begin; k < end && j.status.ok(); ++k) j.status = parts[k].status;
      std::vector<const float*> outs, lses;
      for (size_t k = begin; k < end; ++k) {
        outs.push_back(parts[k].out.data());
        lses.push_back(parts[k].lse.data());
      }
      MergeAttentionParts(outs.data(), lses.data(), static_cast<int>(outs.size()), j.q_heads, d, j.out, j.lse);
      begin = end;
    }
  }

 private:
  static int DefaultThreads() {
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(std::min(hw, 16u));
  }

  // Encodes one job into its cold page and, with `level_page`, also into
  // that level page of the hot pool.
  absl::Status Encode(EncodeJob* j, uint8_t* level_page) {
    thread_local CodecScratch scratch;
    thread_local std::vector<StreamStats> k_each, v_each;
    thread_local std::vector<float> tk, tv;  // the transformed page (inputs are const)
    j->stats = CodecStats();
    const int p = pool_.page_tokens();
    const float* keys = j->keys;
    const float* values = j->values;
    if (!layers_.empty()) {
      absl::StatusOr<const LayerTransform*> t = Transform(j->layer);
      if (!t.ok()) return t.status();
      tk.resize(static_cast<size_t>(p) * codec_.n());
      (*t)->Apply(Mat::kKey, keys, p, tk.data());
      keys = tk.data();
      if (!values_folded_) {
        tv.resize(tk.size());
        (*t)->Apply(Mat::kValue, values, p, tv.data());
        values = tv.data();
      }
    }
    k_each.assign(p, StreamStats());
    v_each.assign(p, StreamStats());
    absl::Status st = level_page == nullptr
                          ? codec_.EncodeWindow(keys, values, p, pool_.key_records(j->page),
                                                pool_.value_records(j->page), pool_.mean_record(j->page), &scratch,
                                                &j->stats.keys, &j->stats.values, k_each.data(), v_each.data())
                          : EncodeLevelPage(codec_, hot_layout_, keys, values, p, pool_.key_records(j->page),
                                            pool_.value_records(j->page), pool_.mean_record(j->page), level_page,
                                            &scratch, &j->stats.keys, &j->stats.values, k_each.data(), v_each.data());
    j->key_utilization.resize(p);
    j->value_utilization.resize(p);
    for (int t = 0; t < p; ++t) {
      j->key_utilization[t] = static_cast<float>(k_each[t].bytes_used) / k_each[t].bytes_budget;
      j->value_utilization[t] = static_cast<float>(v_each[t].bytes_used) / v_each[t].bytes_budget;
    }
    return st;
  }

  // Runs encode(i) for every job over the workers; the first failure.
  template <typename Fn>
  absl::Status ForEachJob(absl::Span<EncodeJob> jobs, Fn encode) {
    std::vector<absl::Status> status(jobs.size());
    workers_.ParallelFor(static_cast<int>(jobs.size()), [&](int i) { status[i] = encode(i); });
    for (const absl::Status& st : status) {
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // Runs move(m) for every move over the workers; the first failure.
  template <typename Fn>
  absl::Status ForEachMove(absl::Span<const TierMove> moves, Fn move) {
    std::vector<absl::Status> status(moves.size());
    workers_.ParallelFor(static_cast<int>(moves.size()), [&](int i) { status[i] = move(moves[i]); });
    for (const absl::Status& st : status) {
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // One part of a hot job: level pages [first, end) of the job and `window`.
  absl::Status AttendHot(const AttendJob& j, size_t first, size_t end, const Bf16Tokens& window, float* out,
                         float* lse) {
    if (hot_pool_ == nullptr) return absl::FailedPreconditionError("a hot attention job without a hot tier");
    thread_local LevelAttentionScratch scratch;
    thread_local std::vector<LevelPageRef> refs;
    refs.clear();
    for (size_t k = first; k < end; ++k) refs.push_back({hot_pool_->page(j.pages[k]), hot_pool_->page_tokens()});
    if (layers_.empty()) {
      return LevelAttention(codec_, refs, window, j.query, j.q_heads, j.softmax_scale, out, lse, &scratch);
    }
    absl::StatusOr<const LayerTransform*> t = Transform(j.layer);
    if (!t.ok()) return t.status();
    return TransformedLevelAttention(codec_, **t, values_folded_, refs, window, j.query, j.q_heads, j.softmax_scale,
                                     out, lse, &scratch);
  }

  absl::StatusOr<const LayerTransform*> Transform(int layer) const {
    if (layer < 0 || layer >= static_cast<int>(layers_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " out of range [0, ", layers_.size(), ") of the transforms"));
    }
    return &layers_[layer];
  }

  const DQuantCodec& codec_;
  const PagePool& pool_;
  const int threads_;
  const std::vector<LayerTransform> layers_;  // per model layer; empty without transforms
  const bool values_folded_;
  const PagePool* const hot_pool_;    // null: no hot tier
  const LevelPageLayout hot_layout_;  // of hot_pool_'s pages
  ThreadPool workers_;                // shared by all calls
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const DQuantCodec* codec, const PagePool* pool, int threads) {
  return std::make_unique<CpuBackend>(codec, pool, threads, std::vector<LayerTransform>(), false);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const BackendArgs& a) {
  absl::StatusOr<const DQuantCodec*> codec = ServedDQuant("cpu", a);
  if (!codec.ok()) return codec.status();
  LevelPageLayout hot_layout;
  if (a.hot_pool != nullptr) {
    absl::StatusOr<LevelPageLayout> l = MakeLevelPageLayout(**codec);
    if (!l.ok()) return absl::InvalidArgumentError(absl::StrCat("hot tier: ", l.status().message()));
    if (a.hot_pool->page_stride() != l->page_bytes || a.hot_pool->page_tokens() != kLevelPageTokens) {
      return absl::InvalidArgumentError(absl::StrCat("hot pool of ", a.hot_pool->page_stride(), "-byte pages of ",
                                                     a.hot_pool->page_tokens(), " tokens; level pages are ",
                                                     l->page_bytes, " bytes of ", kLevelPageTokens));
    }
    hot_layout = *l;
  }
  if (a.transforms == nullptr) {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(
        *codec, a.pool, a.threads, std::vector<LayerTransform>(), false, a.hot_pool, hot_layout));
  }
  const TransformSet& set = *a.transforms;
  if ((*codec)->config().hadamard || set.kv_heads != (*codec)->config().kv_heads ||
      set.head_dim != (*codec)->config().head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("transforms of ", set.kv_heads, " kv heads x ", set.head_dim,
                                                   " need a codec of that shape without rotation; "
                                                   "the codec has ",
                                                   (*codec)->config().kv_heads, " x ", (*codec)->config().head_dim,
                                                   (*codec)->config().hadamard ? " with its Hadamard rotation" : ""));
  }
  std::vector<LayerTransform> layers;
  layers.reserve(set.layers);
  for (int l = 0; l < set.layers; ++l) {
    absl::StatusOr<LayerTransform> t = LayerTransform::FromSet(set, l);
    if (!t.ok()) return t.status();
    layers.push_back(*std::move(t));
  }
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(*codec, a.pool, a.threads, std::move(layers),
                                                               a.values_folded, a.hot_pool, hot_layout));
}

}  // namespace driftkv
