// The CPU backend: codec calls on the host, fanned out over a few threads
// when a call carries more than one page or item.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/backend.h"

namespace driftkv {
namespace {

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller's
// included). Work is claimed one index at a time, so uneven items balance.
template <typename Fn>
void ParallelFor(int n, int threads, Fn fn) {
  const int t = std::max(1, std::min(n, threads));
  if (t == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (int i = 1; i < t; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
}

class CpuBackend : public Backend {
 public:
  CpuBackend(const DQuantCodec* codec, const PagePool* pool, int threads)
      : codec_(*codec), pool_(*pool), threads_(threads > 0 ? threads : DefaultThreads()) {}

  std::string name() const override { return "cpu"; }

  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override {
    std::vector<absl::Status> status(jobs.size());
    ParallelFor(static_cast<int>(jobs.size()), threads_, [&](int i) {
      thread_local CodecScratch scratch;
      EncodeJob& j = jobs[i];
      j.stats = CodecStats();
      status[i] = codec_.EncodeWindow(j.keys, j.values, pool_.page_tokens(),
                                      pool_.key_records(j.page), pool_.value_records(j.page),
                                      pool_.mean_record(j.page), &scratch, &j.stats.keys,
                                      &j.stats.values);
    });
    for (const absl::Status& st : status) {
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status DecodeTokens(PageId page, int first, int count, float* keys,
                            float* values) override {
    thread_local CodecScratch scratch;
    const int n = codec_.n();
    const uint8_t* mean = pool_.mean_record(page);
    for (int t = 0; t < count; ++t) {
      const int i = first + t;
      absl::Status st = codec_.DecodeKey(pool_.key_records(page) + i * codec_.key_stride(), mean,
                                         keys + static_cast<size_t>(t) * n, &scratch);
      if (st.ok()) {
        st = codec_.DecodeValue(pool_.value_records(page) + i * codec_.value_stride(),
                                values + static_cast<size_t>(t) * n, &scratch);
      }
      if (!st.ok()) {
        return absl::DataLossError(absl::StrCat("page ", page, " token ", i, ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }

  void Attend(absl::Span<AttendJob> jobs) override {
    ParallelFor(static_cast<int>(jobs.size()), threads_, [&](int i) {
      thread_local AttentionScratch scratch;
      thread_local std::vector<CompressedBlock> blocks;
      AttendJob& j = jobs[i];
      blocks.clear();
      for (PageId p : j.pages) blocks.push_back(pool_.block(p));
      j.status = CompressedAttention(codec_, blocks, j.window, j.query, j.q_heads,
                                     j.softmax_scale, j.out, j.lse, &scratch);
    });
  }

 private:
  static int DefaultThreads() {
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(std::min(hw, 16u));
  }

  const DQuantCodec& codec_;
  const PagePool& pool_;
  const int threads_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const DQuantCodec* codec, const PagePool* pool,
                                        int threads) {
  return std::make_unique<CpuBackend>(codec, pool, threads);
}

}  // namespace driftkv
