#include "service/copy_helpers.h"

#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace driftkv {
namespace {

// A helper's batch, as the caller and the helper hand it over.
enum : int {
  kArmed = 0,      // Begin woke the helper; it has not looked yet
  kEntered = 1,    // the helper is taking copies
  kAbandoned = 2,  // Finish came first: the helper must not touch it
  kDone = 3,       // the helper has copied and fenced what it took
};

// One turn of a spin-wait: a pause, and every 64th turn the core given up
// (the thread waited on may be preempted where cores are few).
void CpuRelax(int* turns) {
  if (++*turns % 64 == 0) {
    std::this_thread::yield();
    return;
  }
#if defined(__SSE2__)
  _mm_pause();
#endif
}

}  // namespace

void StreamCopy(void* to, const void* from, size_t n) {
  char* d = static_cast<char*>(to);
  const char* s = static_cast<const char*>(from);
  size_t done = 0;
#if defined(__SSE2__)
  if (reinterpret_cast<uintptr_t>(d) % 16 == 0) {
    for (; done + 64 <= n; done += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + done));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + done + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + done + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + done + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + done), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + done + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + done + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + done + 48), e);
    }
  }
#endif
  std::memcpy(d + done, s + done, n - done);
}

void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

struct CopyHelpers::Helper {
  struct Job {
    void* to;
    const void* from;
    size_t n;
  };
  // A call of more items copies the rest itself.
  static constexpr int kJobs = 256;

  CopyHelpers* crew = nullptr;
  std::thread thread;
  absl::CondVar wake;
  bool armed = false;  // guarded by the crew's mu_: Begin handed it a batch

  // The batch. Only the caller writes jobs and `published`; both take
  // copies by advancing `next`.
  std::atomic<int> state{kDone};
  std::atomic<int> published{0};
  std::atomic<int> next{0};
  std::atomic<bool> closed{false};  // the caller adds no more
  Job jobs[kJobs];
};

CopyHelpers::CopyHelpers(int threads) : threads_(threads) {}

CopyHelpers::~CopyHelpers() {
  std::vector<std::unique_ptr<Helper>> helpers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (const std::unique_ptr<Helper>& h : helpers_) h->wake.Signal();
    helpers.swap(helpers_);
  }
  for (const std::unique_ptr<Helper>& h : helpers) h->thread.join();
}

CopyHelpers::Batch CopyHelpers::Begin() {
  Batch batch;
  if (threads_ <= 0) return batch;
  absl::MutexLock lock(&mu_);
  if (!started_) {
    started_ = true;
    for (int i = 0; i < threads_; ++i) {
      helpers_.push_back(std::make_unique<Helper>());
      Helper* h = helpers_.back().get();
      h->crew = this;
      idle_.push_back(h);
      h->thread = std::thread([this, h] { Run(h); });
    }
  }
  if (idle_.empty()) return batch;
  Helper* h = idle_.back();
  idle_.pop_back();
  // The helper reads these only after it sees `armed`, under mu_.
  h->published.store(0, std::memory_order_relaxed);
  h->next.store(0, std::memory_order_relaxed);
  h->closed.store(false, std::memory_order_relaxed);
  h->state.store(kArmed, std::memory_order_relaxed);
  h->armed = true;
  h->wake.Signal();
  batch.helper_ = h;
  return batch;
}

void CopyHelpers::Run(Helper* h) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!h->armed && !stop_) h->wake.Wait(&mu_);
      if (!h->armed) return;
      h->armed = false;
    }
    int armed = kArmed;
    if (h->state.compare_exchange_strong(armed, kEntered, std::memory_order_acq_rel)) {
      helped_.fetch_add(1, std::memory_order_relaxed);
      int turns = 0;
      for (;;) {
        int k = h->next.load(std::memory_order_relaxed);
        if (k < h->published.load(std::memory_order_acquire)) {
          if (h->next.compare_exchange_weak(k, k + 1, std::memory_order_relaxed)) {
            const Helper::Job& j = h->jobs[k];
            StreamCopy(j.to, j.from, j.n);
          }
          continue;
        }
        // Closed after its last publish: nothing left once `next` has
        // passed what was published.
        if (h->closed.load(std::memory_order_acquire) &&
            h->next.load(std::memory_order_relaxed) >= h->published.load(std::memory_order_acquire)) {
          break;
        }
        CpuRelax(&turns);
      }
      StreamFence();
      // The caller sees this and gives the helper back (Batch::Finish): a
      // helper idle before the caller has looked could be armed anew and
      // its state reset under the caller's wait.
      h->state.store(kDone, std::memory_order_release);
    } else {
      // Abandoned before it looked: the caller is gone.
      Idle(h);
    }
  }
}

void CopyHelpers::Idle(Helper* h) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(h);
}

CopyHelpers::Batch& CopyHelpers::Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    Finish();
    helper_ = std::exchange(other.helper_, nullptr);
    unfenced_ = std::exchange(other.unfenced_, false);
  }
  return *this;
}

void CopyHelpers::Batch::Add(void* to, const void* from, size_t n) {
  if (helper_ != nullptr) {
    const int p = helper_->published.load(std::memory_order_relaxed);
    if (p < Helper::kJobs) {
      helper_->jobs[p] = Helper::Job{to, from, n};
      helper_->published.store(p + 1, std::memory_order_release);
      return;
    }
  }
  StreamCopy(to, from, n);
  unfenced_ = true;
}

void CopyHelpers::Batch::Finish() {
  if (helper_ != nullptr) {
    Helper* h = std::exchange(helper_, nullptr);
    h->closed.store(true, std::memory_order_release);
    const int published = h->published.load(std::memory_order_relaxed);
    for (int k = h->next.fetch_add(1, std::memory_order_relaxed); k < published;
         k = h->next.fetch_add(1, std::memory_order_relaxed)) {
      StreamCopy(h->jobs[k].to, h->jobs[k].from, h->jobs[k].n);
    }
    StreamFence();
    unfenced_ = false;
    int armed = kArmed;
    if (!h->state.compare_exchange_strong(armed, kAbandoned, std::memory_order_acq_rel)) {
      // The helper took part: it may be copying one job still.
      int turns = 0;
      while (h->state.load(std::memory_order_acquire) != kDone) CpuRelax(&turns);
      h->crew->Idle(h);
    }
    return;
  }
  if (unfenced_) {
    StreamFence();
    unfenced_ = false;
  }
}

}  // namespace driftkv
