#include "client/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/doorbell.h"
#include "wire/monotonic.h"

namespace driftkv {
namespace {

using doorbell::ClientLine;
using doorbell::ServerLine;

constexpr int64_t kSpinNs = 2'000'000;  // spin up to 2 ms before sleeping

void SetDeadline(const Client& client, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(client.options().timeout)));
}

}  // namespace

uint64_t DoorbellClient::Bytes(uint64_t request_capacity, uint64_t response_capacity) {
  return doorbell::Bytes(request_capacity, response_capacity);
}

absl::StatusOr<std::unique_ptr<DoorbellClient>> DoorbellClient::Open(Client* client, HostRegion* region,
                                                                     uint64_t offset, uint64_t request_capacity,
                                                                     uint64_t response_capacity) {
  const uint64_t bytes = doorbell::Bytes(request_capacity, response_capacity);
  if (offset > region->size() || bytes > region->size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("doorbell of ", bytes, " bytes at offset ", offset,
                                              " does not fit region ", region->id(), " of ", region->size()));
  }
  auto d = std::unique_ptr<DoorbellClient>(new DoorbellClient());
  d->client_ = client;
  d->base_ = static_cast<uint8_t*>(region->data()) + offset;
  d->request_capacity_ = request_capacity;
  d->response_capacity_ = response_capacity;
  std::memset(d->base_, 0, doorbell::kHeaderBytes);
  v1::OpenDoorbellRequest req;
  req.set_region_id(region->id());
  req.set_offset(offset);
  req.set_request_capacity(request_capacity);
  req.set_response_capacity(response_capacity);
  grpc::ClientContext context;
  SetDeadline(*client, &context);
  v1::OpenDoorbellResponse r;
  absl::Status st = FromGrpc(client->stub()->OpenDoorbell(&context, req, &r));
  if (!st.ok()) return st;
  d->id_ = r.doorbell_id();
  return d;
}

DoorbellClient::~DoorbellClient() {
  Close().IgnoreError();
}

absl::Status DoorbellClient::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  v1::CloseDoorbellRequest req;
  req.set_doorbell_id(id_);
  grpc::ClientContext context;
  SetDeadline(*client_, &context);
  v1::CloseDoorbellResponse r;
  return FromGrpc(client_->stub()->CloseDoorbell(&context, req, &r));
}

absl::Status DoorbellClient::Writable(size_t bytes) const {
  if (bytes > request_capacity_) {
    return absl::InvalidArgumentError(
        absl::StrCat("request of ", bytes, " bytes exceeds the doorbell's capacity ", request_capacity_));
  }
  if (broken_ || closed_) return absl::FailedPreconditionError("the doorbell was closed or timed out; open another");
  return absl::OkStatus();
}

absl::StatusOr<v1::AttendResponse> DoorbellClient::Attend(const v1::AttendRequest& request, absl::Duration timeout) {
  const size_t bytes = request.ByteSizeLong();
  if (absl::Status st = Writable(bytes); !st.ok()) return st;
  request.SerializeWithCachedSizesToArray(base_ + doorbell::kHeaderBytes);
  v1::AttendResponse response;
  absl::Status st = Ring(static_cast<uint32_t>(bytes), timeout, &response);
  if (!st.ok()) return st;
  return response;
}

absl::Status DoorbellClient::Call(absl::string_view request_bytes, absl::Duration timeout,
                                  v1::AttendResponse* response) {
  if (absl::Status st = Writable(request_bytes.size()); !st.ok()) return st;
  std::memcpy(base_ + doorbell::kHeaderBytes, request_bytes.data(), request_bytes.size());
  return Ring(static_cast<uint32_t>(request_bytes.size()), timeout, response);
}

absl::Status DoorbellClient::Prepare(uint32_t slot, const v1::AttendRequest& request, absl::Duration timeout) {
  const size_t bytes = request.ByteSizeLong();
  if (absl::Status st = Writable(bytes); !st.ok()) return st;
  request.SerializeWithCachedSizesToArray(base_ + doorbell::kHeaderBytes);
  v1::AttendResponse unused;
  return Ring(static_cast<uint32_t>(bytes), timeout, &unused, doorbell::kPrepare, slot);
}

absl::Status DoorbellClient::AttendPrepared(uint32_t slot, uint64_t token_index_offset, v1::AttendResponse* response,
                                            absl::Duration timeout) {
  if (absl::Status st = Writable(0); !st.ok()) return st;
  return Ring(0, timeout, response, doorbell::kAttendPrepared, slot, token_index_offset);
}

absl::Status DoorbellClient::Ring(uint32_t bytes, absl::Duration timeout, v1::AttendResponse* response, uint32_t kind,
                                  uint32_t slot, uint64_t offset) {
  auto* c = reinterpret_cast<ClientLine*>(base_ + doorbell::kClientLine);
  auto* s = reinterpret_cast<ServerLine*>(base_ + doorbell::kServerLine);
  const int64_t start = MonotonicNs();
  const int64_t deadline = timeout > absl::ZeroDuration() ? start + absl::ToInt64Nanoseconds(timeout) : 0;
  const uint64_t seq = ++seq_;
  __atomic_store_n(&c->request_bytes, bytes, __ATOMIC_RELAXED);
  __atomic_store_n(&c->deadline_ns, deadline, __ATOMIC_RELAXED);
  __atomic_store_n(&c->kind, kind, __ATOMIC_RELAXED);
  __atomic_store_n(&c->slot, slot, __ATOMIC_RELAXED);
  __atomic_store_n(&c->token_index_offset, offset, __ATOMIC_RELAXED);
  __atomic_store_n(&c->request_seq, seq, __ATOMIC_SEQ_CST);
  __atomic_store_n(&c->request_word, static_cast<uint32_t>(seq), __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&s->server_sleeping, __ATOMIC_SEQ_CST) != 0) {
    syscall(SYS_futex, &c->request_word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
  while (__atomic_load_n(&s->response_seq, __ATOMIC_ACQUIRE) != seq) {
    const int64_t now = MonotonicNs();
    if (deadline != 0 && now > deadline + 1'000'000'000) {
      // The server answers a late request with DEADLINE_EXCEEDED itself;
      // a second past the deadline it is not answering at all.
      broken_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("no answer through doorbell ", id_, " within ", absl::FormatDuration(timeout), " and 1 s"));
    }
    if (now - start < kSpinNs) {
      __builtin_ia32_pause();
      continue;
    }
    const uint32_t seen = __atomic_load_n(&s->response_word, __ATOMIC_SEQ_CST);
    if (seen == static_cast<uint32_t>(seq)) continue;
    timespec ts{0, 10 * 1000 * 1000};
    syscall(SYS_futex, &s->response_word, FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  const int32_t code = __atomic_load_n(&s->code, __ATOMIC_RELAXED);
  const uint32_t out_bytes =
      std::min<uint32_t>(__atomic_load_n(&s->response_bytes, __ATOMIC_RELAXED), response_capacity_);
  const char* out = reinterpret_cast<const char*>(base_ + doorbell::kHeaderBytes + request_capacity_);
  if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), absl::string_view(out, out_bytes));
  if (kind == doorbell::kPrepare) return absl::OkStatus();  // nothing answered
  if (!response->ParseFromArray(out, static_cast<int>(out_bytes))) {
    return absl::DataLossError(absl::StrCat("doorbell answer of ", out_bytes, " bytes is not an AttendResponse"));
  }
  return absl::OkStatus();
}

}  // namespace driftkv
