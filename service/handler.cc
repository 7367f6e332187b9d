// Handler: construction (the codec, the pools, the backend and the
// collaborators) and the field checks. The RPCs are in handler_append.cc,
// handler_attend.cc, handler_read.cc, handler_length.cc, handler_fork.cc,
// handler_admin.cc (Release, expiry, Info, Stats) and handler_snapshot.cc.
#include "service/handler.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/attend_batcher.h"
#include "backends/page_format.h"
#include "backends/registry.h"
#include "codec/level_page.h"
#include "service/handler_internal.h"
#include "service/snapshot_file.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::Quoted;

absl::StatusOr<std::unique_ptr<Handler>> Handler::Create(const ServiceOptions& options, Metrics* metrics, Clock clock) {
  // The codec and its page representation by name, through their
  // interfaces: a new one is a new implementation, not a change here.
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(options.codec_options());
  if (!codec.ok()) return codec.status();
  absl::StatusOr<PageLayout> layout = MakePageLayoutFor(options.page_format, **codec);
  if (!layout.ok()) return layout.status();
  if (absl::Status st = ValidateTransform(options); !st.ok()) return st;
  if (options.layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("layers ", options.layers, " must be >= 1"));
  }
  if (options.window_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("window_tokens ", options.window_tokens, " must be >= 0"));
  }
  if (absl::Status st = ValidateHotTier(options); !st.ok()) return st;
  if (!clock) clock = [] { return absl::Now(); };
  std::unique_ptr<Handler> h(new Handler(options, *std::move(codec), metrics));
  h->transform_gain_ = TransformGain(options);
  if (options.transforms != nullptr) h->transforms_checksum_ = TransformsChecksum(*options.transforms);
  // The hot budget's config field, for messages.
  const std::string hot_field = options.hot_tier_fraction > 0.0
                                    ? absl::StrCat("hot_tier_fraction ", options.hot_tier_fraction)
                                    : absl::StrCat("hot_tier_bytes ", options.hot_tier_bytes);
  const int devices = std::max<int>(1, static_cast<int>(options.devices.size()));
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(*layout, options.cold_pool_bytes(), devices);
  if (!pool.ok()) {
    if (options.hot_tier_fraction > 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(hot_field, " leaves the cold pool ", options.cold_pool_bytes(),
                                                     " of pool_bytes ", options.pool_bytes, ": ",
                                                     pool.status().message()));
    }
    return pool.status();
  }
  h->pool_ = *std::move(pool);
  if (options.hot_tier()) {
    // Level pages hold D-Quant's symbols: the hot tier needs that codec.
    const auto* dq = dynamic_cast<const DQuantKvCodec*>(h->codec_.get());
    if (dq == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(hot_field, ": the hot tier needs codec \"dquant\", not \"", h->codec_->name(), "\""));
    }
    absl::StatusOr<LevelPageLayout> level = MakeLevelPageLayout(dq->codec());
    if (!level.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(hot_field, ": the hot tier needs a codec with level pages; ", level.status().message()));
    }
    const uint64_t budget = options.hot_budget_bytes();
    if (budget < level->page_bytes * devices) {
      return absl::InvalidArgumentError(devices == 1
                                            ? absl::StrCat(hot_field, " gives a hot budget of ", budget,
                                                           " bytes, less than one level page of ", level->page_bytes)
                                            : absl::StrCat(hot_field, " gives a hot budget of ", budget,
                                                           " bytes, less than one level page of ", level->page_bytes,
                                                           " for each of ", devices, " devices"));
    }
    // One partition a device, as the cold pool: a sequence's layers move
    // between its device's two partitions.
    absl::StatusOr<std::unique_ptr<PagePool>> hot =
        PagePool::CreateOpaque(level->page_bytes, kLevelPageTokens, budget, devices);
    if (!hot.ok()) return absl::InvalidArgumentError(absl::StrCat(hot_field, ": ", hot.status().message()));
    h->hot_pool_ = *std::move(hot);
  }
  // h->options_ holds a reference to the transform set, and is destroyed
  // after backend_ (declared before it): the set outlives the backend.
  BackendArgs args;
  args.codec = h->codec_.get();
  args.page_format = options.page_format;
  args.pool = h->pool_.get();
  args.threads = options.backend_threads;
  args.transforms = h->options_.transforms.get();
  args.values_folded = h->options_.values_folded;
  args.hot_pool = h->hot_pool_.get();
  args.devices = options.devices;
  args.attend_batching = options.attend_batching;
  args.device_window_cache_bytes = options.device_window_cache_bytes;
  args.device_cold_scratch_bytes = options.device_cold_scratch_bytes;
  {
    Metrics* m = h->metrics_;
    args.attend_observer = [m](int calls, int jobs) {
      m->attend_batch_calls->Observe(calls);
      m->attend_batch_items->Observe(jobs);
    };
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(options.backend, args);
  if (!backend.ok()) return backend.status();
  h->backend_ = *std::move(backend);
  // A device's label: its CUDA index (0 on the cpu backend).
  std::vector<int> device_ids;
  for (int k = 0; k < devices; ++k) {
    device_ids.push_back(options.devices.empty() ? std::max(0, h->backend_->staging_device()) : options.devices[k]);
  }
  if (h->hot_pool_ != nullptr && !h->backend_->SupportsHotTier()) {
    return absl::InvalidArgumentError(absl::StrCat(hot_field, ": backend \"", options.backend, "\" has no hot tier"));
  }
  if (options.attend_batching && h->backend_->PrefersBatchedAttend()) {
    Metrics* m = h->metrics_;
    h->backend_ = std::make_unique<BatchingBackend>(std::move(h->backend_), [m](int calls, int jobs) {
      m->attend_batch_calls->Observe(calls);
      m->attend_batch_items->Observe(jobs);
    });
  }
  if (h->backend_->AddressesClientMemory()) {
    h->inline_staging_ = std::make_unique<PinnedStagingPool>(h->backend_.get());
    // One buffer pinned now, not by the first Attend (pinning takes
    // milliseconds): 4 MiB holds a 64-item call's f32 queries and outputs
    // at 32 query heads x 128.
    h->inline_staging_->Take(size_t{4} << 20);
  }
  h->metrics_->pool_capacity_bytes->Set(static_cast<double>(h->pool_->capacity_bytes()));
  h->metrics_->pool_capacity_pages->Set(static_cast<double>(h->pool_->capacity_pages()));
  h->verifier_ = std::make_unique<PageVerifier>(*h->pool_, h->hot_pool_.get(), *h->backend_, h->metrics_, h->n());
  if (h->hot_pool_ != nullptr) {
    h->metrics_->hot_capacity_bytes->Set(static_cast<double>(h->hot_pool_->capacity_bytes()));
    h->metrics_->hot_capacity_pages->Set(static_cast<double>(h->hot_pool_->capacity_pages()));
    Handler* self = h.get();
    h->hot_ = std::make_unique<HotTier>(
        *h->pool_, *h->hot_pool_, *h->backend_, *h->verifier_, h->metrics_, clock, options.hot_promotion,
        options.hot_idle_seconds, [self] { self->PublishGauges(); }, options.hot_keep_cold_copies);
  }
  h->clock_ = clock;
  h->table_ = std::make_unique<SequenceTable>(h->options_, h->n(), *h->pool_, h->hot_.get(), h->metrics_,
                                              std::move(clock), std::move(device_ids));
  h->codec_identity_ = h->SnapshotIdentity();
  h->events_ = std::make_unique<PageEvents>();
  h->index_ = std::make_unique<PrefixIndex>(*h->pool_, options.layers, h->events_.get());
  h->pins_ = std::make_unique<PinTable>(*h->pool_);
  if (options.levels_below()) {
    if (absl::Status st = ValidateLevels(options); !st.ok()) return st;
    // A snapshot about to be loaded names records of the disk level: the
    // store is kept for it (LoadSnapshot erases what it does not name).
    const bool keep_disk = !options.disk_level.wipe_at_start && !options.snapshot_dir.empty() &&
                           std::ifstream(SnapshotPath(options.snapshot_dir)).good();
    absl::StatusOr<std::unique_ptr<SpillTier>> spill =
        SpillTier::Create(options.host_level, options.disk_level, *h->pool_, h->metrics_, h->backend_.get(), keep_disk);
    if (!spill.ok()) return spill.status();
    h->spill_ = *std::move(spill);
    SpillTier* t = h->spill_.get();
    h->table_->SetSpillHooks({[t](const SequencePtr& seq) { t->Track(seq); },
                              [t](Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu) { t->Forget(seq); }});
  } else {
    // The level's series exist at zero without it, as the hot tier's do
    // (the registry keeps them; dashboards and alerts find them).
    SpillMetrics host(*h->metrics_, "host");
    SpillMetrics disk(*h->metrics_, "disk");
  }
  // A Reserve of the cold pool that falls short takes back the hot tier's
  // cold copies first (they only save demotions work), then evicts cached
  // pages (Append, decode steps, demotion, restore alike), then moves least
  // recently used sequences to the levels below (host memory, disk).
  h->pool_->SetReclaimer([self = h.get()](int64_t pages, int partition) {
    int64_t freed = self->hot_ != nullptr ? self->hot_->ReclaimCopies(pages, partition) : 0;
    if (freed >= pages) return;
    const int64_t evicted = self->index_->Evict(pages - freed, partition);
    if (evicted > 0) self->metrics_->prefix_evictions->Increment(static_cast<double>(evicted));
    freed += evicted;
    if (freed < pages && self->spill_ != nullptr) self->spill_->MoveDown(pages - freed, partition);
  });
  h->PublishGauges();
  return h;
}

Handler::~Handler() {
  // The promotion thread publishes gauges through the table: stop it first.
  if (hot_ != nullptr) hot_->Stop();
  if (pool_ != nullptr) pool_->SetReclaimer(nullptr);
}

float Handler::value_limit() const {
  return static_cast<float>(codec_->max_abs_value() / (2.0 * transform_gain_));
}

double Handler::TransformGain(const ServiceOptions& o) {
  switch (o.transform) {
    case TransformKind::kIdentity: return 1.0;
    case TransformKind::kHadamard:
      // Every entry of the normalised Hadamard matrix is +-1/sqrt(d).
      return std::sqrt(static_cast<double>(o.codec.head_dim));
    case TransformKind::kWush: break;
  }
  const TransformSet& t = *o.transforms;
  const int d = t.head_dim;
  double gain = 1.0;  // folded values pass untransformed
  for (int l = 0; l < t.layers; ++l) {
    for (int h = 0; h < t.kv_heads; ++h) {
      for (Mat m : {Mat::kKey, Mat::kValue}) {
        if (m == Mat::kValue && o.values_folded) continue;
        const float* a = t.matrix(l, h, m);
        for (int i = 0; i < d; ++i) {
          double row = 0.0;
          for (int j = 0; j < d; ++j) row += std::fabs(static_cast<double>(a[i * d + j]));
          gain = std::max(gain, row);
        }
      }
    }
  }
  return gain;
}

absl::Status Handler::CheckLayer(absl::string_view field, uint32_t layer) const {
  if (layer >= static_cast<uint32_t>(options_.layers)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", layer, " out of range [0, ", options_.layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status Handler::Resident(Sequence* seq, absl::string_view id, std::vector<SpillPin>* pins, int64_t* restored) {
  if (spill_ == nullptr) return absl::OkStatus();
  pins->emplace_back(seq);
  return spill_->Restore(seq, id, restored);
}

absl::Status Handler::CheckSequenceId(absl::string_view field, const std::string& id) const {
  if (id.empty() || id.size() > kMaxSequenceIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", id.size(), " bytes; it must have 1 to ", kMaxSequenceIdBytes));
  }
  if (const int64_t at = handler_internal::ControlByteOffset(id); at >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has byte 0x", absl::Hex(static_cast<unsigned char>(id[at]), absl::kZeroPad2), " at offset ", at,
        "; NUL and control bytes (below 0x20, and 0x7f) are not allowed in a sequence id"));
  }
  return absl::OkStatus();
}

}  // namespace driftkv
