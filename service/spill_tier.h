// The levels below the cold pool (docs/tiers.md): host memory (a
// tiers::HostPageStore, page-locked by the backend) and local disk (a
// tiers::DiskPageStore), either or both. When the pool is short, the cold
// pages of least recently used sequences move down; a sequence's pages
// come back before it is used. On the CPU backend the pool is host memory
// already, so the host level only adds a second budget there; on CUDA the
// pool is the GPU's and the host level is the one a restore reads at
// PCIe speed (Backend::PagesToHost/PagesFromHost: one launch each way).
//
// WHERE A MOVE GOES. Down: to host memory when the host level has room
// for the whole sequence; else, with a disk level, the least recently
// used sequences on the host level move on to disk until it has (never
// waiting for a lock, as below), and when that still leaves too little
// room the sequence goes straight to disk. Up: from wherever it is,
// straight into the pool.
//
// GRANULARITY. A whole sequence moves: every page of every layer goes down
// together and comes back together. Windows (bf16 tokens not yet in a page),
// digests and checksums stay in memory; a layer below keeps pages.size()
// (token counts, quotas and BytesOf unchanged) with every entry kPageBelow,
// and its pages' host slots or disk keys in Sequence::below_keys
// (layer-major order).
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
// pinned sequence is never moved down (nor on from host to disk). The race
// between a pin and a move is closed by two sequentially consistent
// atomics: MoveDown sets Sequence::below_hint, then reads the pins (backing
// off when there is one); a request adds its pin, then reads below_hint
// (and restores under the writer lock when it is set). One of the two sees
// the other.
//
// SWAPS. A sequence below comes back into a full pool only when another
// moves down to make room, so each level keeps room for one sequence (the
// largest that has gone below, at most a quarter of the level) that only
// the moves down a Restore causes may use: with every level otherwise
// full, Append is refused (RESOURCE_EXHAUSTED) while sequences below still
// come back, each swapping places with the least recently used. The room
// is back once the restored sequence's slots are free (host) or its
// records' segment is deleted (disk: space of erased records is kept
// until then).
//
// INTEGRITY. A page goes down with the CRC-32C the layer keeps for it
// (page_sums): the disk store refuses bytes that do not match it and checks
// it again when the page is read back; from either level, Restore checks
// the bytes as the backend holds them for attention (the device's copy on
// CUDA, summed there) before anything is served. A mismatch or a read error
// is DATA_LOSS for that sequence (counted in
// driftkv_level_checksum_failures_total of its level), nothing of it is
// served, it stays below, and every other sequence is unaffected.
//
// Locks: mu_ (the candidates, the erase queue) is a leaf; it is taken under
// the table's, sequences' and layers' locks, and nothing is acquired under
// it. The stores have their own.
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
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "backends/page_pool.h"
#include "service/config.h"
#include "service/sequence.h"
#include "service/spill_metrics.h"
#include "tiers/disk_page_store.h"
#include "tiers/host_page_store.h"

namespace driftkv {

// A page id that names no pool page: the page is on a level below.
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
  // Opens the levels that are on (at least one): the host level's block,
  // page-locked by `backend` (PinHostRegion; a failure is refused, naming
  // host_level.budget_bytes), and the disk store under disk.dir (wiping
  // it: docs/tiers.md), for pages of `pool`'s page size. `pool`, `metrics`
  // and `backend` must outlive the tier; the backend makes every move
  // (PagesToHost, PagesFromHost, UploadPages after a disk read).
  // `keep_disk`: the disk store is opened as it is (its index from the
  // segments' footers) instead of wiped, for a snapshot that names its
  // records (RESTART below); every record no AdoptBelow claims is erased
  // by EraseUnclaimed.
  static absl::StatusOr<std::unique_ptr<SpillTier>> Create(const HostLevelOptions& host, const DiskLevelOptions& disk,
                                                           PagePool& pool, Metrics* metrics, Backend* backend,
                                                           bool keep_disk = false);
  // Stops the eraser (records still queued for erasing stay on disk until
  // the next start wipes them or finds them unclaimed), then closes the
  // stores.
  ~SpillTier();

  // A sequence entered the table: a candidate from now on (held weakly).
  void Track(const SequencePtr& seq) ABSL_LOCKS_EXCLUDED(mu_);
  // The pool's reclaimer: moves sequences of `partition` down, least
  // recently used first (Sequence::last_access_ns), skipping pinned ones,
  // ones whose lock is held, hot layers, and ones no level has room for,
  // until `pages` pool pages were freed or no candidate is left. Returns
  // the pages freed.
  int64_t MoveDown(int64_t pages, int partition) ABSL_LOCKS_EXCLUDED(mu_);
  // Brings `seq`'s pages back into the pool when they are below; OK at
  // once otherwise (one atomic load). `id`: the request's sequence_id, for
  // messages. RESOURCE_EXHAUSTED when the pool has no room even after
  // moving others down; DATA_LOSS naming the layer and page when a page
  // does not come back intact; UNAVAILABLE for an I/O error or a copy
  // to the backend that fails (the pages stay below). A released
  // sequence is left to the caller (OK). *restored (when given): the pages
  // brought back. REQUIRES: the caller pins `seq` and holds none of its
  // locks.
  absl::Status Restore(Sequence* seq, absl::string_view id, int64_t* restored = nullptr);
  // Frees `seq`'s pages below (host slots at once, disk records by the
  // eraser) and forgets them (release, expiry). REQUIRES: seq.below.
  void Forget(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu);

  // Waits until every queued erase has run, or erasing is frozen (tests,
  // benchmarks).
  void DrainErases() ABSL_LOCKS_EXCLUDED(mu_);

  // RESTART. A drain's snapshot names the disk records of the sequences on
  // disk by key, and carries the bytes of those on the host level (memory,
  // gone with the process). Freeze, before it is written, stops erasing
  // for the rest of the process, so that every record it names is still
  // there at the next start (erases queued meanwhile are left to that
  // start). At that start the store is kept (Create's keep_disk), the
  // load adopts each sequence below where it was: slots taken and filled
  // for the host level's, disk keys checked with HasDiskPage and claimed by
  // AdoptBelow; then EraseUnclaimed queues every other record for erasing
  // (those of sequences the load dropped, erases that a process did not
  // finish). Without a snapshot the store is wiped.
  void Freeze() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasDiskPage(uint64_t key) const { return store_ != nullptr && store_->Contains(key); }
  // A free host slot to fill, or RESOURCE_EXHAUSTED (FAILED_PRECONDITION
  // without a host level); GiveHostSlots hands back those of a sequence
  // that is not adopted after all.
  absl::StatusOr<uint64_t> TakeHostSlot();
  uint8_t* HostSlot(uint64_t slot) const { return host_->slot(slot); }
  void GiveHostSlots(const std::vector<uint64_t>& slots) { host_->Give(slots); }
  // `seq`'s pages (every entry of its layers kPageBelow, their checksums in
  // page_sums) are in host slots or disk records `keys`, layer-major.
  // REQUIRES: seq entered into the table (so tracked).
  void AdoptBelow(Sequence& seq, bool on_host, std::vector<uint64_t> keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Queues every record of the store that no AdoptBelow claimed for
  // erasing; the number queued.
  int64_t EraseUnclaimed() ABSL_LOCKS_EXCLUDED(mu_);
  // The levels; null when off.
  const tiers::HostPageStore* host_store() const { return host_.get(); }
  const tiers::DiskPageStore* disk_store() const { return store_.get(); }
  // Sequences below now, on either level.
  int64_t sequences_below() const { return on_host_.load() + on_disk_.load(); }
  int64_t sequences_on_host() const { return on_host_.load(); }

 private:
  enum Where : int { kHost = 0, kDisk = 1 };
  using Pages = std::vector<std::pair<LayerState*, size_t>>;  // every page: its layer and index
  SpillTier(PagePool& pool, Metrics* metrics, Backend* backend)
      : pool_(pool), metrics_{SpillMetrics(*metrics, "host"), SpillMetrics(*metrics, "disk")}, backend_(*backend) {}
  // Moves one sequence down; the pool pages it freed (0: it stayed).
  int64_t MoveDownLocked(Sequence* seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq->mu);
  // The moves of one sequence's pages (`where`, layer-major), each true
  // when it happened. REQUIRES: seq pinned by nobody (the hint set).
  bool PoolToHostLocked(Sequence* seq, const Pages& where) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq->mu);
  bool PoolToDiskLocked(Sequence* seq, const Pages& where) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq->mu);
  bool HostToDiskLocked(Sequence* seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq->mu);
  // Writes the pages `where` names to new disk records, page j's bytes at
  // bytes(j) with its checksum from page_sums: true with their keys in
  // *keys; false (what was written queued for erasing, the failure
  // counted) when any write fails.
  bool WriteToDisk(const Pages& where, const std::function<const uint8_t*(size_t)>& bytes, std::vector<uint64_t>* keys);
  // `seq`'s pages are now under `keys` on `level` (a move down: counted
  // and timed from `start`). REQUIRES: nothing held below
  // (DropBelowLocked first).
  void PlacedLocked(Sequence& seq, Where level, std::vector<uint64_t> keys, absl::Time start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu);
  // Frees what `seq` holds below (host slots at once, disk records by the
  // eraser) and forgets its keys; `below` is the caller's to change.
  void DropBelowLocked(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu);
  // Moves sequences on the host level to disk, least recently used first,
  // until it has `slots` free: true when it has. `mover`: the sequence
  // being moved down (locked by the caller), never one of them.
  bool MakeHostRoom(int64_t slots, const Sequence* mover) ABSL_LOCKS_EXCLUDED(mu_);
  // Every page of `seq`, layer-major.
  static Pages PagesOf(Sequence* seq) ABSL_SHARED_LOCKS_REQUIRED(seq->mu);
  // Whether the disk level can take `pages` more pages, past its swap room.
  bool DiskHasRoom(size_t pages) const;
  // The swap room of a level of `capacity` pages (SWAPS): 0 for the moves
  // down of a Restore.
  int64_t SwapRoom(int64_t capacity) const;
  // A sequence of `pages` went below: the swap room follows the largest.
  void NoteSize(size_t pages);
  // Reads `seq`'s pages back into `fresh` from its level.
  absl::Status ReadBack(Sequence* seq, const Pages& where, const std::vector<PageId>& fresh, absl::string_view id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq->mu);
  // Runs `jobs` Put or Get calls on the disk store and waits for all of
  // them: each job's status, in order.
  std::vector<absl::Status> RunAll(size_t jobs,
                                   const std::function<absl::Status(size_t, tiers::DiskPageStore::Callback)>& submit);
  void Publish();
  void EraseLoop();
  void Counted(Where level, int direction, size_t pages);

  PagePool& pool_;
  SpillMetrics metrics_[2];  // by Where
  Backend& backend_;
  std::unique_ptr<tiers::HostPageStore> host_;
  std::unique_ptr<tiers::DiskPageStore> store_;
  std::atomic<uint64_t> next_key_{1};  // disk keys are never reused in a process
  std::atomic<int64_t> on_host_{0};
  std::atomic<int64_t> on_disk_{0};
  std::atomic<int64_t> largest_{0};  // pages of the largest sequence that went below

  absl::Mutex mu_;
  std::vector<std::weak_ptr<Sequence>> candidates_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> to_erase_ ABSL_GUARDED_BY(mu_);
  int erasing_ ABSL_GUARDED_BY(mu_) = 0;  // taken from to_erase_, not yet erased
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  // Records found at a kept start, not yet claimed by AdoptBelow.
  absl::flat_hash_set<uint64_t> unclaimed_ ABSL_GUARDED_BY(mu_);
  std::thread eraser_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SPILL_TIER_H_
