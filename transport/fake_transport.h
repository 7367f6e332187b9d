// A scripted Transport for tests of the channel state machine
// (tests/nccl_channel_test.cc): the test plays the peer through the
// FakeLink of each peer id: it queues what the peer sends, makes the link
// fail, or keeps the peer away, and reads what the server did.
#ifndef DRIFTKV_TRANSPORT_FAKE_TRANSPORT_H_
#define DRIFTKV_TRANSPORT_FAKE_TRANSPORT_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace driftkv {

class FakeLink {
 public:
  // The peer's next send: one string per part, delivered to the next
  // receive (at once if one is waiting).
  void QueueSend(std::vector<std::string> parts);
  // The peer joins (default) or never does.
  void SetJoins(bool joins);
  // The receive in flight, or the next one, fails as a dead peer would.
  void FailNextRecv();
  int aborts() const;
  int receives() const;  // StartRecv calls

 private:
  friend class FakeTransport;
  mutable absl::Mutex mu_;
  bool joins_ ABSL_GUARDED_BY(mu_) = true;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  int receives_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::vector<std::string>> queued_ ABSL_GUARDED_BY(mu_);
  std::vector<TransportBuffer> posted_ ABSL_GUARDED_BY(mu_);  // the receive in flight
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeTransportFactory : public TransportFactory {
 public:
  explicit FakeTransportFactory(int version = 22809) : version_(version) {}
  int version() const override { return version_; }
  bool needs_device_memory() const override { return false; }
  absl::StatusOr<std::unique_ptr<Transport>> Connect(absl::string_view peer_id, int device) override;
  // The link of `peer_id` (made on first use, by the test or by Connect).
  std::shared_ptr<FakeLink> link(absl::string_view peer_id);

 private:
  const int version_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<FakeLink>> links_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_TRANSPORT_FAKE_TRANSPORT_H_
