// Makes Debian's absl::Mutex visible to ThreadSanitizer (--config=tsan).
//
// Debian's libabsl_synchronization is built without -fsanitize=thread, so
// TSan sees none of its locking: every access guarded by an absl::Mutex
// would be reported as a race. This file, linked into the executable only
// in TSan builds (elsewhere it compiles to nothing), interposes the
// exported Mutex, CondVar and Notification entry points: each calls the
// library's own function (found with dlsym(RTLD_NEXT)) and tells TSan of
// the happens-before edge it implies: release before an unlock (and before
// a CondVar wait or a Notify), acquire after every lock, await, wait or
// notification. The model is a release/acquire pair per object: it finds
// data races across critical sections exactly, but makes no deadlock
// reports and treats two reader locks as ordered (a race between two
// readers that both write is not found; readers do not write here).
#if defined(__SANITIZE_THREAD__)

#include <dlfcn.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

namespace {

// The library's definition of `mangled`, looked up once.
template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) std::abort();
  return reinterpret_cast<Fn>(f);
}

void* Key(const void* p) { return const_cast<void*>(p); }

// Memory accesses during a library call are not checked: the library
// evaluates Conditions (our lambdas reading guarded state) inside Lock,
// Unlock and Await, on whichever thread runs them, at points where it
// holds the lock but TSan cannot tell.
struct Ignore {
  Ignore() { __tsan_ignore_thread_begin(); }
  ~Ignore() { __tsan_ignore_thread_end(); }
};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

#define DRIFTKV_REAL(var, type, mangled) static const auto var = Real<type>(mangled)

void Mutex::Lock() {
  DRIFTKV_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  {
    Ignore ignore;
    real(this);
  }
  __tsan_acquire(this);
}
void Mutex::ReaderLock() {
  DRIFTKV_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  {
    Ignore ignore;
    real(this);
  }
  __tsan_acquire(this);
}
bool Mutex::TryLock() {
  DRIFTKV_REAL(real, bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  bool got;
  {
    Ignore ignore;
    got = real(this);
  }
  if (got) __tsan_acquire(this);
  return got;
}
bool Mutex::ReaderTryLock() {
  DRIFTKV_REAL(real, bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  bool got;
  {
    Ignore ignore;
    got = real(this);
  }
  if (got) __tsan_acquire(this);
  return got;
}
void Mutex::Unlock() {
  DRIFTKV_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  {
    Ignore ignore;
    real(this);
  }
}
void Mutex::ReaderUnlock() {
  DRIFTKV_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  {
    Ignore ignore;
    real(this);
  }
}
void Mutex::LockWhen(const Condition& cond) {
  DRIFTKV_REAL(real, void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  {
    Ignore ignore;
    real(this, cond);
  }
  __tsan_acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  DRIFTKV_REAL(real, void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  {
    Ignore ignore;
    real(this, cond);
  }
  __tsan_acquire(this);
}
void Mutex::Await(const Condition& cond) {
  DRIFTKV_REAL(real, void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  {
    Ignore ignore;
    real(this, cond);
  }
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  DRIFTKV_REAL(real, bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  bool r;
  {
    Ignore ignore;
    r = real(this, cond, timeout);
  }
  __tsan_acquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  DRIFTKV_REAL(real, bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  bool r;
  {
    Ignore ignore;
    r = real(this, cond, deadline);
  }
  __tsan_acquire(this);
  return r;
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  DRIFTKV_REAL(real, bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r;
  {
    Ignore ignore;
    r = real(this, cond, timeout);
  }
  __tsan_acquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  DRIFTKV_REAL(real, bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r;
  {
    Ignore ignore;
    r = real(this, cond, deadline);
  }
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  DRIFTKV_REAL(real, void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  {
    Ignore ignore;
    real(this, mu);
  }
  __tsan_acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  DRIFTKV_REAL(real, bool (*)(CondVar*, Mutex*, absl::Duration),
               "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  bool r;
  {
    Ignore ignore;
    r = real(this, mu, timeout);
  }
  __tsan_acquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  DRIFTKV_REAL(real, bool (*)(CondVar*, Mutex*, absl::Time),
               "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  bool r;
  {
    Ignore ignore;
    r = real(this, mu, deadline);
  }
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  DRIFTKV_REAL(real, void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(Key(this));
  {
    Ignore ignore;
    real(this);
  }
}
void Notification::WaitForNotification() const {
  DRIFTKV_REAL(real, void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  {
    Ignore ignore;
    real(this);
  }
  __tsan_acquire(Key(this));
}
bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  DRIFTKV_REAL(real, bool (*)(const Notification*, absl::Duration),
               "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  bool r;
  {
    Ignore ignore;
    r = real(this, timeout);
  }
  if (r) __tsan_acquire(Key(this));
  return r;
}

#undef DRIFTKV_REAL

ABSL_NAMESPACE_END
}  // namespace absl

#endif  // __SANITIZE_THREAD__
