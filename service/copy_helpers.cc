#include "service/copy_helpers.h"

#include <chrono>
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

// One batch's copies. Only the caller writes jobs and `published`; it and
// its helpers take copies by advancing `next`.
struct CopyHelpers::Work {
  struct Job {
    void* to;
    const void* from;
    size_t n;
  };
  // A call of more items copies the rest itself.
  static constexpr int kJobs = 256;

  std::atomic<int> published{0};
  std::atomic<int> next{0};
  std::atomic<bool> closed{false};  // the caller adds no more
  Job jobs[kJobs];
};

struct CopyHelpers::Helper {
  std::thread thread;
  absl::CondVar wake;
  bool sleeping = false;  // guarded by the crew's mu_
  // Set by Begin (after `work` and `state`); the helper clears it.
  std::atomic<bool> armed{false};
  std::atomic<int> state{kDone};
  Work* work = nullptr;
};

CopyHelpers::CopyHelpers(int threads, absl::Duration spin) : threads_(threads), spin_(spin) {}

CopyHelpers::~CopyHelpers() {
  std::vector<std::unique_ptr<Helper>> helpers;
  {
    absl::MutexLock lock(&mu_);
    stop_.store(true);
    for (const std::unique_ptr<Helper>& h : helpers_) h->wake.Signal();
    helpers.swap(helpers_);
  }
  for (const std::unique_ptr<Helper>& h : helpers) h->thread.join();
}

CopyHelpers::Batch CopyHelpers::Begin() {
  Batch batch;
  batch.crew_ = this;
  if (threads_ <= 0) return batch;
  absl::MutexLock lock(&mu_);
  if (!started_) {
    started_ = true;
    // A batch has at least one helper: no more batches than helpers run
    // with helpers at once.
    for (int i = 0; i < threads_; ++i) {
      works_.push_back(std::make_unique<Work>());
      idle_works_.push_back(works_.back().get());
      helpers_.push_back(std::make_unique<Helper>());
      Helper* h = helpers_.back().get();
      idle_.push_back(h);
      h->thread = std::thread([this, h] { Run(h); });
    }
  }
  if (idle_.empty()) return batch;
  Work* w = idle_works_.back();
  idle_works_.pop_back();
  w->published.store(0, std::memory_order_relaxed);
  w->next.store(0, std::memory_order_relaxed);
  w->closed.store(false, std::memory_order_relaxed);
  for (Helper* h : idle_) {
    h->work = w;
    h->state.store(kArmed, std::memory_order_relaxed);
    h->armed.store(true, std::memory_order_release);  // publishes the three above
    if (h->sleeping) h->wake.Signal();
    batch.helpers_.push_back(h);
  }
  idle_.clear();
  batch.work_ = w;
  return batch;
}

void CopyHelpers::Run(Helper* h) {
  using Clock = std::chrono::steady_clock;
  const Clock::duration spin = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(spin_));
  for (;;) {
    // Polls for the next batch for `spin`, then sleeps until Begin wakes it.
    const Clock::time_point until = Clock::now() + spin;
    int turns = 0;
    while (!h->armed.load(std::memory_order_acquire)) {
      if (stop_.load(std::memory_order_relaxed)) return;
      if (Clock::now() < until) {
        CpuRelax(&turns);
        continue;
      }
      absl::MutexLock lock(&mu_);
      h->sleeping = true;
      while (!h->armed.load(std::memory_order_acquire) && !stop_.load(std::memory_order_relaxed)) h->wake.Wait(&mu_);
      h->sleeping = false;
      if (!h->armed.load(std::memory_order_acquire)) return;
    }
    h->armed.store(false, std::memory_order_relaxed);
    int armed = kArmed;
    if (!h->state.compare_exchange_strong(armed, kEntered, std::memory_order_acq_rel)) {
      Idle(h);  // abandoned before it looked: the caller is gone
      continue;
    }
    helped_.fetch_add(1, std::memory_order_relaxed);
    Work* w = h->work;
    turns = 0;
    for (;;) {
      int k = w->next.load(std::memory_order_relaxed);
      if (k < w->published.load(std::memory_order_acquire)) {
        if (w->next.compare_exchange_weak(k, k + 1, std::memory_order_relaxed)) {
          const Work::Job& j = w->jobs[k];
          StreamCopy(j.to, j.from, j.n);
        }
        continue;
      }
      // Closed after its last publish: nothing left once `next` has passed
      // what was published.
      if (w->closed.load(std::memory_order_acquire) &&
          w->next.load(std::memory_order_relaxed) >= w->published.load(std::memory_order_acquire)) {
        break;
      }
      CpuRelax(&turns);
    }
    StreamFence();
    h->state.store(kDone, std::memory_order_release);  // the caller gives it back
  }
}

void CopyHelpers::Idle(Helper* h) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(h);
}

void CopyHelpers::Idle(Work* w) {
  absl::MutexLock lock(&mu_);
  idle_works_.push_back(w);
}

CopyHelpers::Batch& CopyHelpers::Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    Finish();
    crew_ = std::exchange(other.crew_, nullptr);
    work_ = std::exchange(other.work_, nullptr);
    helpers_ = std::move(other.helpers_);
    other.helpers_.clear();
    unfenced_ = std::exchange(other.unfenced_, false);
  }
  return *this;
}

void CopyHelpers::Batch::Add(void* to, const void* from, size_t n) {
  if (work_ != nullptr) {
    const int p = work_->published.load(std::memory_order_relaxed);
    if (p < Work::kJobs) {
      work_->jobs[p] = Work::Job{to, from, n};
      work_->published.store(p + 1, std::memory_order_release);
      return;
    }
  }
  StreamCopy(to, from, n);
  unfenced_ = true;
}

void CopyHelpers::Batch::Finish() {
  if (work_ != nullptr) {
    Work* w = std::exchange(work_, nullptr);
    w->closed.store(true, std::memory_order_release);
    const int published = w->published.load(std::memory_order_relaxed);
    for (int k = w->next.fetch_add(1, std::memory_order_relaxed); k < published;
         k = w->next.fetch_add(1, std::memory_order_relaxed)) {
      StreamCopy(w->jobs[k].to, w->jobs[k].from, w->jobs[k].n);
    }
    StreamFence();
    for (Helper* h : helpers_) {
      int armed = kArmed;
      if (!h->state.compare_exchange_strong(armed, kAbandoned, std::memory_order_acq_rel)) {
        // The helper took part: it may be copying one job still.
        int turns = 0;
        while (h->state.load(std::memory_order_acquire) != kDone) CpuRelax(&turns);
        crew_->Idle(h);
      }
    }
    helpers_.clear();
    // No helper touches the work now: each is done or never looked.
    crew_->Idle(w);
  } else if (unfenced_) {
    StreamFence();
  }
  unfenced_ = false;
}

}  // namespace driftkv
