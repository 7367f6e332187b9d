#include "service/attend_poller.h"

#include <chrono>
#include <utility>

#include <grpc/support/time.h>

namespace driftkv {

struct AttendPoller::Call {
  grpc::ServerContext context;
  grpc::ByteBuffer request;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer{&context};
  bool answered = false;  // Finish was called; the next event ends the call
};

AttendPoller::AttendPoller(std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues, absl::Duration spin,
                           RequestFn request, ServeFn serve)
    : queues_(std::move(queues)), spin_(spin), request_(std::move(request)), serve_(std::move(serve)) {}

AttendPoller::~AttendPoller() {
  Stop();
}

void AttendPoller::Start() {
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& cq : queues_) {
    grpc::ServerCompletionQueue* q = cq.get();
    threads_.emplace_back([this, q] { Run(q); });
  }
}

void AttendPoller::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& cq : queues_) cq->Shutdown();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void AttendPoller::RequestOne(grpc::ServerCompletionQueue* cq) {
  Call* call = new Call();
  request_(&call->context, &call->request, &call->writer, cq, call);
}

void AttendPoller::Run(grpc::ServerCompletionQueue* cq) {
  using Clock = std::chrono::steady_clock;
  const Clock::duration spin = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(spin_));
  RequestOne(cq);
  Clock::time_point spin_until = Clock::now();
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    // A zero deadline polls (and runs the sockets' work here); past the
    // spin window, block until the next event.
    const bool spinning = Clock::now() < spin_until;
    const grpc::CompletionQueue::NextStatus next =
        cq->AsyncNext(&tag, &ok, spinning ? gpr_time_0(GPR_CLOCK_MONOTONIC) : gpr_inf_future(GPR_CLOCK_MONOTONIC));
    if (next == grpc::CompletionQueue::SHUTDOWN) return;
    if (next == grpc::CompletionQueue::TIMEOUT) continue;
    Call* call = static_cast<Call*>(tag);
    if (call->answered || !ok) {
      // The answer went out (or the call was cancelled on its way), or the
      // server is shutting down and the request was withdrawn.
      delete call;
    } else {
      grpc::ByteBuffer response;
      const grpc::Status status = serve_(&call->context, &call->request, &response);
      // Only now, so that a thread that is serving has no call waiting on
      // its queue; and before the answer, so that the server's Shutdown,
      // which waits for this call, returns only after it (the queue is
      // shut down after that, and must not be asked for a call then).
      RequestOne(cq);
      call->answered = true;
      if (status.ok()) {
        call->writer.Finish(response, status, call);
      } else {
        call->writer.FinishWithError(status, call);
      }
    }
    spin_until = Clock::now() + spin;
  }
}

}  // namespace driftkv
