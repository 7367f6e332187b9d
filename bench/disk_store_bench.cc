// The disk level's sustained throughput (tiers/disk_page_store.h) beside
// the disk's own sequential limit, in the same run and the same directory
// (docs/tiers.md, "Figures"):
//
//   disk_store_bench DIR [MIB=2048] [THREADS=4] [QUEUE=64] [SYNC_PAGES=2000]
//
// Per page size (74,496 bytes: a cold page of the default shape; 96,320):
//   dd      `dd if=/dev/zero of=DIR/dd.bin bs=1M oflag=direct conv=fdatasync`
//           of MIB MiB, then `dd if=DIR/dd.bin of=/dev/null bs=1M
//           iflag=direct`: the disk's sequential write and read, page cache
//           bypassed;
//   write   MIB MiB of pages through PutAsync (kProcess durability), timed
//           from the first submit to the store's close (which seals and
//           fdatasyncs the last segment: every byte is on the device);
//   open    Open on the result: seconds and bytes read (footers only);
//   read    every page through GetAsync, CRC-checked by the store, read with
//           O_DIRECT (cold: the page cache is bypassed, never warm);
//   sync    SYNC_PAGES pages with kPowerLoss (fdatasync after each write).
// GB/s count page bytes (10^9), not the records' padding.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

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

DiskPageStoreOptions Options(const std::string& dir, size_t page_bytes, int threads, int queue) {
  DiskPageStoreOptions o;
  o.dir = dir;
  o.page_bytes = page_bytes;
  o.budget_bytes = uint64_t{1} << 40;
  o.io_threads = threads;
  o.queue_capacity = queue;
  o.submit_wait = absl::Seconds(60);
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

void Bench(const std::string& dir, size_t page_bytes, uint64_t mib, int threads, int queue, uint64_t sync_pages) {
  const uint64_t n = (mib << 20) / page_bytes;
  const double gb = static_cast<double>(n * page_bytes) / 1e9;
  const Pages pages = MakePages(page_bytes, 64);
  std::printf("\npage %zu bytes: %" PRIu64 " pages (%.2f GB of pages, %.2f GB of records), %d threads, queue %d\n",
              page_bytes, n, gb, static_cast<double>(n * RecordBytes(page_bytes)) / 1e9, threads, queue);

  // The disk's own limit: the same number of bytes as the records.
  const uint64_t dd_mib = (n * RecordBytes(page_bytes)) >> 20;
  const std::string dd_file = dir + "/dd.bin";
  uint64_t dd_bytes = 0;
  const double dd_w =
      RunDd("if=/dev/zero of=" + dd_file + " bs=1M count=" + std::to_string(dd_mib) + " oflag=direct conv=fdatasync",
            &dd_bytes);
  const double dd_w_gbs = dd_bytes / dd_w / 1e9;
  const double dd_r = RunDd("if=" + dd_file + " of=/dev/null bs=1M iflag=direct", &dd_bytes);
  const double dd_r_gbs = dd_bytes / dd_r / 1e9;
  std::remove(dd_file.c_str());
  if (dd_w <= 0 || dd_r <= 0) {
    std::fprintf(stderr, "dd failed\n");
    std::exit(1);
  }

  const std::string store_dir = dir + "/store";
  DiskPageStoreOptions o = Options(store_dir, page_bytes, threads, queue);
  o.wipe_at_open = true;
  absl::Time t0 = absl::Now();
  bool direct = false;
  {
    absl::StatusOr<std::unique_ptr<DiskPageStore>> s = DiskPageStore::Open(o);
    CHECK_OK(s.status());
    PutAll(**s, pages, n);
    direct = (*s)->stats().direct_io;
  }  // close: seals and fdatasyncs the last segment
  const double write_s = absl::ToDoubleSeconds(absl::Now() - t0);

  o.wipe_at_open = false;
  absl::StatusOr<std::unique_ptr<DiskPageStore>> s = DiskPageStore::Open(o);
  CHECK_OK(s.status());
  const DiskPageStoreStats open = (*s)->stats();
  if (open.pages != n) {
    std::fprintf(stderr, "reopened with %" PRIu64 " pages, not %" PRIu64 "\n", open.pages, n);
    std::exit(1);
  }
  std::vector<std::vector<uint8_t>> dst(queue + threads + 1, std::vector<uint8_t>(page_bytes));
  std::atomic<uint64_t> done{0}, bad{0};
  absl::Notification all;
  t0 = absl::Now();
  // Destination buffers are reused round-robin; a buffer is reused only
  // after the queue has moved past it (queue + threads jobs apart), and
  // every page is checked against its source in the callback.
  for (uint64_t k = 0; k < n; ++k) {
    uint8_t* d = dst[k % dst.size()].data();
    CHECK_OK((*s)->GetAsync(k, d, [&, k, d](absl::Status st) {
      if (!st.ok() || Crc32cExtend(0, d, page_bytes) != pages.crc[k % pages.crc.size()]) ++bad;
      if (++done == n) all.Notify();
    }));
  }
  all.WaitForNotification();
  const double read_s = absl::ToDoubleSeconds(absl::Now() - t0);
  if (bad > 0) {
    std::fprintf(stderr, "%" PRIu64 " pages read back wrong\n", bad.load());
    std::exit(1);
  }
  s->reset();

  // Durability kPowerLoss: an fdatasync per write.
  double sync_s = 0;
  if (sync_pages > 0) {
    o.wipe_at_open = true;
    o.durability = Durability::kPowerLoss;
    t0 = absl::Now();
    {
      absl::StatusOr<std::unique_ptr<DiskPageStore>> w = DiskPageStore::Open(o);
      CHECK_OK(w.status());
      PutAll(**w, pages, sync_pages);
    }
    sync_s = absl::ToDoubleSeconds(absl::Now() - t0);
  }
  std::filesystem::remove_all(store_dir);

  std::printf("direct_io: %s (reads bypass the page cache: cold)\n", direct ? "yes" : "NO (page cache in the way)");
  std::printf("%-34s %10s %12s %10s\n", "what", "GB/s", "pages/s", "x dd");
  std::printf("%-34s %10.3f %12s %10s\n", "dd write 1M oflag=direct fdatasync", dd_w_gbs, "", "");
  std::printf("%-34s %10.3f %12s %10s\n", "dd read 1M iflag=direct", dd_r_gbs, "", "");
  std::printf("%-34s %10.3f %12.0f %10.2f\n", "store write (kProcess, to close)", gb / write_s, n / write_s,
              gb / write_s / dd_w_gbs);
  std::printf("%-34s %10.3f %12.0f %10.2f\n", "store read (O_DIRECT, CRC checked)", gb / read_s, n / read_s,
              gb / read_s / dd_r_gbs);
  if (sync_pages > 0) {
    const double sync_gb = static_cast<double>(sync_pages * page_bytes) / 1e9;
    std::printf("%-34s %10.3f %12.0f %10.2f\n", "store write (kPowerLoss, fdatasync)", sync_gb / sync_s,
                sync_pages / sync_s, sync_gb / sync_s / dd_w_gbs);
  }
  std::printf("open: %.3f s, %" PRIu64 " bytes read (%.4f%% of the records), %" PRIu64 " segments from footers\n",
              open.open_seconds, open.open_bytes_read,
              100.0 * open.open_bytes_read / static_cast<double>(n * RecordBytes(page_bytes)),
              open.open_segments_footer);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: disk_store_bench DIR [MIB=2048] [THREADS=4] [QUEUE=64] [SYNC_PAGES=2000]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 2048;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 4;
  const int queue = argc > 4 ? std::atoi(argv[4]) : 64;
  const uint64_t sync_pages = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 2000;
  std::filesystem::create_directories(dir);
  for (size_t page_bytes : {size_t{74496}, size_t{96320}}) Bench(dir, page_bytes, mib, threads, queue, sync_pages);
  return 0;
}
