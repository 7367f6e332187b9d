// Unary calls of one method served by threads that poll their completion
// queues without sleeping while calls keep coming (config
// attend_poll_threads; docs/data_plane.md, "A polling door for inline
// Attend").
//
// gRPC's synchronous server parks its threads in epoll and wakes one per
// call; on the H200 host each wake-up on the way in and out of a call costs
// tens of microseconds. Each poller thread here owns one completion queue,
// keeps one call requested on it, serves the call on that thread (so a
// thread that is busy has nothing requested and gRPC hands new calls to
// the others), then asks its queue with a zero timeout, which also runs
// gRPC's socket work on this thread, until `spin` has passed without a
// call; only then does it block. While a decode worker sends one call per
// layer, no thread on the server side sleeps between them.
//
// Calls arrive as bytes (the method is marked raw) and answer with a
// ByteBuffer, so that the serving function decides the wire form.
#ifndef DRIFTKV_SERVICE_ATTEND_POLLER_H_
#define DRIFTKV_SERVICE_ATTEND_POLLER_H_

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <grpcpp/completion_queue.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_unary_call.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/time/time.h"
#include "service/call_trace.h"

namespace driftkv {

class AttendPoller {
 public:
  // Asks gRPC for the next call of the method on `cq`, with `tag` as its
  // completion tag (a raw method's RequestAsyncUnary).
  using RequestFn = std::function<void(grpc::ServerContext* context, grpc::ByteBuffer* request,
                                       grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer,
                                       grpc::ServerCompletionQueue* cq, void* tag)>;
  // Serves one call: its request bytes in, the answer's bytes out (sent
  // only with an OK status). With a trace, the call's phases are what the
  // function leaves on this thread's AttendPhaseClock (it begins them).
  using ServeFn =
      std::function<grpc::Status(grpc::ServerContext* context, grpc::ByteBuffer* request, grpc::ByteBuffer* response)>;

  // One thread per queue (from ServerBuilder::AddCompletionQueue, before
  // BuildAndStart); Start once the server is built.
  AttendPoller(std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues, absl::Duration spin, RequestFn request,
               ServeFn serve);
  ~AttendPoller();  // Stop()
  AttendPoller(const AttendPoller&) = delete;
  AttendPoller& operator=(const AttendPoller&) = delete;

  void Start();
  // After grpc::Server::Shutdown: shuts the queues down, lets each thread
  // drain its queue (cancelled requests, answers being sent) and joins.
  // A call still being served then (the server's Shutdown returns once its
  // deadline has cancelled the calls, not when their serving ends) is
  // dropped unanswered: its client has seen CANCELLED already.
  // Idempotent.
  void Stop();

 private:
  struct Call;
  // One queue and what guards it: a queue that is shut down must not be
  // given new work (gRPC aborts the process), so asking for a call or
  // sending an answer and shutting the queue down exclude each other.
  struct Queue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    std::mutex mu;
    bool shut = false;  // guarded by mu
  };
  void Run(Queue* q);
  void RequestOne(Queue* q);  // REQUIRES: q->mu held, !q->shut

  std::vector<std::unique_ptr<Queue>> queues_;
  const absl::Duration spin_;
  const RequestFn request_;
  const ServeFn serve_;
  // DRIFTKV_ATTEND_TRACE: each call's arrival, serving and send times.
  const std::unique_ptr<CallTrace> trace_ = CallTrace::FromEnv();
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_POLLER_H_
