// The disk level below the cold pool (docs/tiers.md): moves the cold pages
// of least recently used sequences to a tiers::DiskPageStore when the pool
// is short, and brings a sequence's pages back before it is used. On the
// CPU backend the pool is host memory, so this is "host memory, disk below
// it"; on CUDA the same moves would go between the GPU's pool and the disk
// (not enabled: config validation refuses a hot tier with the disk level).
//
// GRANULARITY. A whole sequence moves: every page of every layer goes down
// together and comes back together. Windows (bf16 tokens not yet in a page),
// digests and checksums stay in memory; a layer below keeps pages.size()
// (token counts, quotas and BytesOf unchanged) with every entry kPageBelow,
// and its pages' disk keys in Sequence::below_keys (layer-major order).
//
// WHO MOVES WHAT. MoveDown is the pool's reclaimer (after the prefix
// index's eviction): it runs inside a Reserve, on the thread that asked for
// pages, possibly under that thread's sequence and layer locks. It only
// TryLocks a victim's Sequence::mu as a writer, so it never waits for a lock
// and never takes a sequence that anyone is reading, attending or appending
// to (they hold it as readers). Restore runs on the request's thread before
// the request takes its locks.
//
// PINS. A request pins each sequence it uses (SpillPin) before it calls
// Restore, and keeps the pin until it has released the sequence's locks: a
// pinned sequence is never moved down. The race between a pin and a move is
// closed by two sequentially consistent atomics: MoveDown sets
// Sequence::below_hint, then reads the pins (backing off when there is
// one); a request adds its pin, then reads below_hint (and restores under
// the writer lock when it is set). One of the two sees the other.
//
// INTEGRITY. A page goes down with the CRC-32C the layer keeps for it
// (page_sums): the store refuses bytes that do not match it, and checks it
// again when the page is read back; Restore then checks the bytes in the
// pool once more. A mismatch or a read error is DATA_LOSS for that sequence
// (counted in driftkv_level_checksum_failures_total), nothing of it is
// served, it stays below, and every other sequence is unaffected.
//
// Locks: mu_ (the candidates, the erase queue) is a leaf; it is taken under
// the table's, sequences' and layers' locks, and nothing is acquired under
// it. The store has its own.
#ifndef DRIFTKV_SERVICE_SPILL_TIER_H_
#define DRIFTKV_SERVICE_SPILL_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "backends/page_pool.h"
#include "service/config.h"
#include "service/sequence.h"
#include "service/spill_metrics.h"
#include "tiers/disk_page_store.h"

namespace driftkv {

// A page id that names no pool page: the page is on the disk level.
constexpr PageId kPageBelow = -1;

// Holds a sequence in place (see PINS) for as long as it lives.
class SpillPin {
 public:
  explicit SpillPin(Sequence* seq) : seq_(seq) {
    if (seq_ != nullptr) seq_->spill_pins.fetch_add(1);
  }
  ~SpillPin() {
    if (seq_ != nullptr) seq_->spill_pins.fetch_sub(1);
  }
  SpillPin(SpillPin&& other) noexcept : seq_(other.seq_) { other.seq_ = nullptr; }
  SpillPin(const SpillPin&) = delete;
  SpillPin& operator=(const SpillPin&) = delete;

 private:
  Sequence* seq_;
};

class SpillTier {
 public:
  // Gives restored pages to the backend that keeps copies of pool pages
  // (the CUDA backend's device copies: Backend::UploadPages); null when
  // the pool's bytes are all there is.
  using Upload = std::function<absl::Status(const std::vector<PageId>&)>;
  // Opens the store under options.dir (wiping it: docs/tiers.md) for pages
  // of `pool`'s page size. `pool` and `metrics` must outlive the tier.
  static absl::StatusOr<std::unique_ptr<SpillTier>> Create(const DiskLevelOptions& options, PagePool& pool,
                                                           Metrics* metrics, Upload upload = nullptr);
  // Stops the eraser (records still queued for erasing stay on disk until
  // the wipe of the next start), then closes the store.
  ~SpillTier();

  // A sequence entered the table: a candidate from now on (held weakly).
  void Track(const SequencePtr& seq) ABSL_LOCKS_EXCLUDED(mu_);
  // The pool's reclaimer: moves sequences of `partition` down, least
  // recently used first (Sequence::last_access_ns), skipping pinned ones,
  // ones whose lock is held, hot layers, and ones whose pages the disk
  // budget cannot take, until `pages` pool pages were freed or no candidate
  // is left. Returns the pages freed.
  int64_t MoveDown(int64_t pages, int partition) ABSL_LOCKS_EXCLUDED(mu_);
  // Brings `seq`'s pages back into the pool when they are below; OK at
  // once otherwise (one atomic load). `id`: the request's sequence_id, for
  // messages. RESOURCE_EXHAUSTED when the pool has no room even after
  // moving others down; DATA_LOSS naming the layer and page when a page
  // does not come back intact; UNAVAILABLE for an I/O error or an upload
  // to the backend that fails (the pages stay below). A released
  // sequence is left to the caller (OK). *restored (when given): the pages
  // brought back. REQUIRES: the caller pins `seq` and holds none of its
  // locks.
  absl::Status Restore(Sequence* seq, absl::string_view id, int64_t* restored = nullptr);
  // Queues the erasing of `seq`'s pages below and forgets them (release,
  // expiry). REQUIRES: seq->mu held as a writer; seq->below.
  void Forget(Sequence& seq);

  // Waits until every queued erase has run (tests, benchmarks).
  void DrainErases() ABSL_LOCKS_EXCLUDED(mu_);
  const tiers::DiskPageStore& store() const { return *store_; }
  // Sequences below now.
  int64_t sequences_below() const { return sequences_below_.load(); }

 private:
  SpillTier(PagePool& pool, Metrics* metrics, Upload upload)
      : pool_(pool), metrics_(*metrics), upload_(std::move(upload)) {}
  // Moves one sequence down; the pool pages it freed (0: it stayed).
  // REQUIRES: seq->mu held as a writer.
  int64_t MoveDownLocked(Sequence* seq);
  // Runs `jobs` Put or Get calls on the store and waits for all of them:
  // each job's status, in order.
  std::vector<absl::Status> RunAll(size_t jobs,
                                   const std::function<absl::Status(size_t, tiers::DiskPageStore::Callback)>& submit);
  void Publish();
  void EraseLoop();

  PagePool& pool_;
  SpillMetrics metrics_;
  const Upload upload_;
  std::unique_ptr<tiers::DiskPageStore> store_;
  std::atomic<uint64_t> next_key_{1};  // disk keys are never reused in a process
  std::atomic<int64_t> sequences_below_{0};

  absl::Mutex mu_;
  std::vector<std::weak_ptr<Sequence>> candidates_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> to_erase_ ABSL_GUARDED_BY(mu_);
  int erasing_ ABSL_GUARDED_BY(mu_) = 0;  // taken from to_erase_, not yet erased
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread eraser_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SPILL_TIER_H_
