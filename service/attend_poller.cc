#include "service/attend_poller.h"

#include <chrono>
#include <utility>

#include <grpc/support/time.h>

#include "backends/attend_phases.h"
#include "wire/monotonic.h"

namespace driftkv {

struct AttendPoller::Call {
  grpc::ServerContext context;
  grpc::ByteBuffer request;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer{&context};
  bool answered = false;  // Finish was called; the next event ends the call
  CallTrace::Call times;  // with a trace only
};

AttendPoller::AttendPoller(std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues, absl::Duration spin,
                           RequestFn request, ServeFn serve)
    : spin_(spin), request_(std::move(request)), serve_(std::move(serve)) {
  for (std::unique_ptr<grpc::ServerCompletionQueue>& cq : queues) {
    queues_.push_back(std::make_unique<Queue>());
    queues_.back()->cq = std::move(cq);
  }
}

AttendPoller::~AttendPoller() {
  Stop();
}

void AttendPoller::Start() {
  for (const std::unique_ptr<Queue>& q : queues_) {
    Queue* queue = q.get();
    threads_.emplace_back([this, queue] { Run(queue); });
  }
}

void AttendPoller::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (const std::unique_ptr<Queue>& q : queues_) {
    std::lock_guard<std::mutex> lock(q->mu);
    q->shut = true;
    q->cq->Shutdown();
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void AttendPoller::RequestOne(Queue* q) {
  Call* call = new Call();
  request_(&call->context, &call->request, &call->writer, q->cq.get(), call);
}

void AttendPoller::Run(Queue* q) {
  using Clock = std::chrono::steady_clock;
  const Clock::duration spin = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(spin_));
  {
    std::lock_guard<std::mutex> lock(q->mu);
    if (!q->shut) RequestOne(q);
  }
  Clock::time_point spin_until = Clock::now();
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    // A zero deadline polls (and runs the sockets' work here); past the
    // spin window, block until the next event.
    const bool spinning = Clock::now() < spin_until;
    const grpc::CompletionQueue::NextStatus next =
        q->cq->AsyncNext(&tag, &ok, spinning ? gpr_time_0(GPR_CLOCK_MONOTONIC) : gpr_inf_future(GPR_CLOCK_MONOTONIC));
    if (next == grpc::CompletionQueue::SHUTDOWN) return;
    if (next == grpc::CompletionQueue::TIMEOUT) continue;
    Call* call = static_cast<Call*>(tag);
    if (call->answered || !ok) {
      // The answer went out (or the call was cancelled on its way), or the
      // server is shutting down and the request was withdrawn.
      if (trace_ != nullptr && call->answered && ok) {
        call->times.finished_ns = MonotonicNs();
        trace_->Record(call->times);
      }
      delete call;
    } else {
      if (trace_ != nullptr) call->times.arrived_ns = MonotonicNs();
      grpc::ByteBuffer response;
      const grpc::Status status = serve_(&call->context, &call->request, &response);
      if (trace_ != nullptr) {
        call->times.served_ns = MonotonicNs();
        // serve_ ran on this thread: its phase clock holds the call's.
        int64_t phases = 0;
        for (int64_t ns : AttendPhaseClock::totals()) phases += ns;
        call->times.phases_ns = phases;
      }
      std::lock_guard<std::mutex> lock(q->mu);
      if (q->shut) {
        // Stopped while serving: the server has ended the call already.
        delete call;
      } else {
        // Only now, so that a thread that is serving has no call waiting
        // on its queue.
        RequestOne(q);
        call->answered = true;
        if (status.ok()) {
          call->writer.Finish(response, status, call);
        } else {
          call->writer.FinishWithError(status, call);
        }
      }
    }
    spin_until = Clock::now() + spin;
  }
}

}  // namespace driftkv
