// The disk level's sustained throughput (tiers/disk_page_store.h) beside
// the disk's own sequential limit, in the same run and the same directory
// (docs/tiers.md, "Figures"):
//
//   disk_store_bench DIR [MIB=1024] [READERS=16] [WRITERS=4] [QUEUE=256]
//                    [SYNC_PAGES=2000] [ROUNDS=3]
//
// Per page size (74,496 bytes: a cold page of the default shape; 96,320),
// ROUNDS rounds of, back to back (the disk's speed drifts: each figure is
// compared with dd's of its own round, and the medians are printed):
//   dd      `dd if=/dev/zero of=DIR/dd.bin bs=1M oflag=direct conv=fdatasync`
//           of as many bytes as the records, later `dd if=DIR/dd.bin
//           of=/dev/null bs=1M iflag=direct`: the disk's sequential write
//           and read, page cache bypassed;
//   write   MIB MiB of pages through PutAsync (kProcess durability), timed
//           from the first submit to the store's close (which seals and
//           fdatasyncs the last segment: every byte is on the device);
//   open    Open on the result: seconds and bytes read (footers only);
//   read    every page through GetAsync, CRC-checked by the store, read with
//           O_DIRECT (cold: the page cache is bypassed, never warm), and
//           compared with its source here;
//   sync    once, SYNC_PAGES pages with kPowerLoss (fdatasync after each
//           write call);
//   crash   once, Open after a child writing pages killed itself (SIGKILL)
//           with 1.5 segments stored: the time and bytes of the scan.
// Other options are the store's defaults; for experiments the environment
// may set DISK_BENCH_PREALLOCATE=0|1, DISK_BENCH_WRITE_MIB=N (the largest
// write call) and DISK_BENCH_DIRECT=0|1 (0: buffered I/O, and the reads are
// then no longer cold).
// GB/s count page bytes (10^9), not the records' padding.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/check.h"
#include "tiers/disk_page_store.h"
#include "wire/crc32c.h"

using namespace driftkv;
using namespace driftkv::tiers;

namespace {

// Seconds and bytes of one dd run, from its closing line ("N bytes ...
// copied, S s, ..."); -1 when it failed.
double RunDd(const std::string& args, uint64_t* bytes) {
  const std::string cmd = "dd " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char line[512];
  double seconds = -1;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    unsigned long long b = 0;
    const char* copied = std::strstr(line, "copied, ");
    if (copied != nullptr && std::sscanf(line, "%llu bytes", &b) == 1) {
      *bytes = b;
      seconds = std::atof(copied + 8);
    }
  }
  return pclose(p) == 0 ? seconds : -1;
}

struct Pages {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<uint32_t> crc;
};

Pages MakePages(size_t page_bytes, int count) {
  Pages p;
  std::mt19937_64 rng(page_bytes);
  for (int i = 0; i < count; ++i) {
    std::vector<uint8_t> b(page_bytes);
    for (size_t j = 0; j < page_bytes; j += 8) {
      const uint64_t v = rng();
      std::memcpy(b.data() + j, &v, std::min<size_t>(8, page_bytes - j));
    }
    p.crc.push_back(Crc32cExtend(0, b.data(), b.size()));
    p.bytes.push_back(std::move(b));
  }
  return p;
}

DiskPageStoreOptions Options(const std::string& dir, size_t page_bytes, int readers, int writers, int queue) {
  DiskPageStoreOptions o;
  o.dir = dir;
  o.page_bytes = page_bytes;
  o.budget_bytes = uint64_t{1} << 40;
  o.read_threads = readers;
  o.write_threads = writers;
  o.queue_capacity = queue;
  o.submit_wait = absl::Seconds(60);
  if (const char* e = std::getenv("DISK_BENCH_PREALLOCATE")) o.preallocate = std::atoi(e) != 0;
  if (const char* e = std::getenv("DISK_BENCH_WRITE_MIB")) o.max_write_bytes = std::strtoull(e, nullptr, 10) << 20;
  if (const char* e = std::getenv("DISK_BENCH_DIRECT")) o.direct_io = std::atoi(e) != 0;
  return o;
}

// Puts pages 0..n-1 (contents cycling through `pages`), waiting for all.
void PutAll(DiskPageStore& s, const Pages& pages, uint64_t n) {
  std::atomic<uint64_t> done{0}, failed{0};
  absl::Notification all;
  for (uint64_t k = 0; k < n; ++k) {
    const size_t i = k % pages.bytes.size();
    CHECK_OK(s.PutAsync(k, pages.bytes[i].data(), pages.crc[i], [&](absl::Status st) {
      if (!st.ok()) {
        std::fprintf(stderr, "put: %s\n", std::string(st.message()).c_str());
        ++failed;
      }
      if (++done == n) all.Notify();
    }));
  }
  all.WaitForNotification();
  if (failed > 0) std::exit(1);
}

struct Round {
  double dd_write = 0, dd_read = 0, write = 0, read = 0;  // GB/s
  double pages_per_call = 0;
  DiskPageStoreStats open;
  bool direct = false;
};

// One round: dd write, the store's write, dd read, the store's read, back
// to back so that each pair sees the same disk.
Round RunRound(const std::string& dir, const DiskPageStoreOptions& options, const Pages& pages, uint64_t n, int queue,
               int readers) {
  Round r;
  const size_t page_bytes = options.page_bytes;
  const double gb = static_cast<double>(n * page_bytes) / 1e9;
  const uint64_t dd_mib = (n * RecordBytes(page_bytes)) >> 20;  // as many bytes as the records
  const std::string dd_file = dir + "/dd.bin";
  uint64_t dd_bytes = 0;
  const double dd_w =
      RunDd("if=/dev/zero of=" + dd_file + " bs=1M count=" + std::to_string(dd_mib) + " oflag=direct conv=fdatasync",
            &dd_bytes);
  if (dd_w <= 0) std::exit(1);
  r.dd_write = dd_bytes / dd_w / 1e9;

  DiskPageStoreOptions o = options;
  o.wipe_at_open = true;
  absl::Time t0 = absl::Now();
  {
    absl::StatusOr<std::unique_ptr<DiskPageStore>> s = DiskPageStore::Open(o);
    CHECK_OK(s.status());
    PutAll(**s, pages, n);
    r.direct = (*s)->stats().direct_io;
    r.pages_per_call = static_cast<double>(n) / (*s)->stats().write_calls;
  }  // close: seals and fdatasyncs the last segment
  r.write = gb / absl::ToDoubleSeconds(absl::Now() - t0);

  o.wipe_at_open = false;
  absl::StatusOr<std::unique_ptr<DiskPageStore>> s = DiskPageStore::Open(o);
  CHECK_OK(s.status());
  r.open = (*s)->stats();
  if (r.open.pages != n) {
    std::fprintf(stderr, "reopened with %" PRIu64 " pages, not %" PRIu64 "\n", r.open.pages, n);
    std::exit(1);
  }
  // Destination buffers: a free list, a buffer back on it once its read's
  // callback has checked the page against its source.
  std::vector<std::vector<uint8_t>> dst(queue + readers + 1, std::vector<uint8_t>(page_bytes));
  absl::Mutex free_mu;
  std::vector<size_t> free_list;
  for (size_t i = 0; i < dst.size(); ++i) free_list.push_back(i);
  std::atomic<uint64_t> done{0}, bad{0};
  absl::Notification all;
  t0 = absl::Now();
  for (uint64_t k = 0; k < n; ++k) {
    size_t slot;
    {
      absl::MutexLock lock(&free_mu);
      free_mu.Await(absl::Condition(
          +[](std::vector<size_t>* f) { return !f->empty(); }, &free_list));
      slot = free_list.back();
      free_list.pop_back();
    }
    uint8_t* d = dst[slot].data();
    CHECK_OK((*s)->GetAsync(k, d, [&, k, d, slot](absl::Status st) {
      if (!st.ok() || std::memcmp(d, pages.bytes[k % pages.bytes.size()].data(), page_bytes) != 0) ++bad;
      {
        absl::MutexLock lock(&free_mu);
        free_list.push_back(slot);
      }
      if (++done == n) all.Notify();
    }));
  }
  all.WaitForNotification();
  r.read = gb / absl::ToDoubleSeconds(absl::Now() - t0);
  if (bad > 0) {
    std::fprintf(stderr, "%" PRIu64 " pages read back wrong\n", bad.load());
    std::exit(1);
  }
  s->reset();
  const double dd_r = RunDd("if=" + dd_file + " of=/dev/null bs=1M iflag=direct", &dd_bytes);
  std::remove(dd_file.c_str());
  if (dd_r <= 0) std::exit(1);
  r.dd_read = dd_bytes / dd_r / 1e9;
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Bench(const std::string& dir, size_t page_bytes, uint64_t mib, int readers, int writers, int queue,
           uint64_t sync_pages, int rounds) {
  const uint64_t n = (mib << 20) / page_bytes;
  const Pages pages = MakePages(page_bytes, 64);
  std::printf("\npage %zu bytes: %" PRIu64
              " pages (%.2f GB of pages, %.2f GB of records), %d readers, %d writers, "
              "queue %d\n",
              page_bytes, n, static_cast<double>(n * page_bytes) / 1e9,
              static_cast<double>(n * RecordBytes(page_bytes)) / 1e9, readers, writers, queue);
  const std::string store_dir = dir + "/store";
  const DiskPageStoreOptions o = Options(store_dir, page_bytes, readers, writers, queue);
  std::printf("%5s %9s %9s %7s %9s %9s %7s %9s %11s\n", "round", "dd w GB/s", "store w", "x dd", "dd r GB/s", "store r",
              "x dd", "pages/wr", "open s");
  std::vector<double> wx, rx, w, r;
  bool direct = true;
  for (int i = 0; i < rounds; ++i) {
    const Round x = RunRound(dir, o, pages, n, queue, readers);
    direct = direct && x.direct;
    wx.push_back(x.write / x.dd_write);
    rx.push_back(x.read / x.dd_read);
    w.push_back(x.write);
    r.push_back(x.read);
    std::printf("%5d %9.3f %9.3f %7.2f %9.3f %9.3f %7.2f %9.1f %11.4f\n", i + 1, x.dd_write, x.write, wx.back(),
                x.dd_read, x.read, rx.back(), x.pages_per_call, x.open.open_seconds);
    if (i == 0) {
      std::printf("      open read %" PRIu64 " bytes (%.4f%% of the records) from %" PRIu64 " footers\n",
                  x.open.open_bytes_read,
                  100.0 * x.open.open_bytes_read / static_cast<double>(n * RecordBytes(page_bytes)),
                  x.open.open_segments_footer);
    }
  }
  std::printf(
      "median: store write %.3f GB/s (%.0f pages/s) = %.2f x dd; store read %.3f GB/s (%.0f pages/s) = "
      "%.2f x dd; direct_io %s (reads cold: the page cache bypassed)\n",
      Median(w), Median(w) * 1e9 / page_bytes, Median(wx), Median(r), Median(r) * 1e9 / page_bytes, Median(rx),
      direct ? "yes" : "NO");

  // Durability kPowerLoss: an fdatasync after each write call.
  if (sync_pages > 0) {
    DiskPageStoreOptions s = o;
    s.wipe_at_open = true;
    s.durability = Durability::kPowerLoss;
    const absl::Time t0 = absl::Now();
    {
      absl::StatusOr<std::unique_ptr<DiskPageStore>> st = DiskPageStore::Open(s);
      CHECK_OK(st.status());
      PutAll(**st, pages, sync_pages);
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    std::printf("kPowerLoss: %" PRIu64 " pages in %.3f s: %.3f GB/s, %.0f pages/s\n", sync_pages, secs,
                static_cast<double>(sync_pages * page_bytes) / 1e9 / secs, sync_pages / secs);
  }

  // Open after kill -9: a child writes until 1.5 segments of pages are
  // stored, then kills itself with writes in flight; Open scans the
  // segment it was writing (payloads verified) and reads the footers of
  // the others.
  {
    DiskPageStoreOptions c = o;
    c.wipe_at_open = true;
    const uint64_t target = c.segment_bytes * 3 / 2 / RecordBytes(page_bytes);
    const pid_t child = fork();
    if (child == 0) {
      absl::StatusOr<std::unique_ptr<DiskPageStore>> st = DiskPageStore::Open(c);
      if (!st.ok()) _exit(2);
      std::atomic<uint64_t> stored{0};
      for (uint64_t k = 0;; ++k) {
        const size_t i = k % pages.bytes.size();
        (void)(*st)->PutAsync(k, pages.bytes[i].data(), pages.crc[i], [&](absl::Status r) {
          if (r.ok() && ++stored == target) raise(SIGKILL);
        });
      }
    }
    int wstatus = 0;
    waitpid(child, &wstatus, 0);
    if (!WIFSIGNALED(wstatus)) std::exit(1);
    c.wipe_at_open = false;
    absl::StatusOr<std::unique_ptr<DiskPageStore>> st = DiskPageStore::Open(c);
    CHECK_OK(st.status());
    const DiskPageStoreStats x = (*st)->stats();
    std::printf("open after kill -9 at %" PRIu64 " pages stored: %.3f s, %" PRIu64 " pages, %" PRIu64
                " segments scanned, %" PRIu64 " from footers, %" PRIu64 " bytes read, %" PRIu64 " blocks skipped\n",
                target, x.open_seconds, x.pages, x.open_segments_scanned, x.open_segments_footer, x.open_bytes_read,
                x.open_skipped_blocks);
  }
  std::filesystem::remove_all(store_dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: disk_store_bench DIR [MIB=1024] [READERS=16] [WRITERS=4] [QUEUE=256] [SYNC_PAGES=2000] "
                 "[ROUNDS=3]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const int readers = argc > 3 ? std::atoi(argv[3]) : 16;
  const int writers = argc > 4 ? std::atoi(argv[4]) : 4;
  const int queue = argc > 5 ? std::atoi(argv[5]) : 256;
  const uint64_t sync_pages = argc > 6 ? std::strtoull(argv[6], nullptr, 10) : 2000;
  const int rounds = argc > 7 ? std::atoi(argv[7]) : 3;
  std::filesystem::create_directories(dir);
  for (size_t page_bytes : {size_t{74496}, size_t{96320}}) {
    Bench(dir, page_bytes, mib, readers, writers, queue, sync_pages, rounds);
  }
  return 0;
}
