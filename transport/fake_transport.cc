#include "transport/fake_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace driftkv {

class FakeTransport : public Transport {
 public:
  explicit FakeTransport(std::shared_ptr<FakeLink> link) : link_(std::move(link)) {}

  absl::StatusOr<bool> Connected() override {
    absl::MutexLock lock(&link_->mu_);
    if (link_->aborted_) return absl::AbortedError("fake link aborted");
    return link_->joins_;
  }

  absl::Status StartRecv(absl::Span<const TransportBuffer> parts) override {
    absl::MutexLock lock(&link_->mu_);
    if (link_->aborted_) return absl::AbortedError("fake link aborted");
    if (link_->in_flight_) return absl::FailedPreconditionError("fake link busy");
    link_->posted_.assign(parts.begin(), parts.end());
    link_->in_flight_ = true;
    ++link_->receives_;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> RecvDone() override {
    absl::MutexLock lock(&link_->mu_);
    FakeLink& l = *link_;
    if (l.aborted_) return absl::AbortedError("fake link aborted");
    if (!l.in_flight_) return absl::FailedPreconditionError("no receive in flight");
    if (l.fail_) {
      l.fail_ = false;
      return absl::UnavailableError("fake link: the peer died");
    }
    if (l.queued_.empty()) return false;
    std::vector<std::string> parts = std::move(l.queued_.front());
    l.queued_.pop_front();
    if (parts.size() != l.posted_.size()) return absl::DataLossError("fake link: part count differs");
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].size() != l.posted_[i].bytes) {
        return absl::DataLossError(
            absl::StrCat("fake link: part ", i, " has ", parts[i].size(), " bytes, the receive ", l.posted_[i].bytes));
      }
      std::memcpy(l.posted_[i].data, parts[i].data(), parts[i].size());
    }
    l.in_flight_ = false;
    return true;
  }

  void Abort() override {
    absl::MutexLock lock(&link_->mu_);
    if (!link_->aborted_) ++link_->aborts_;
    link_->aborted_ = true;
    link_->in_flight_ = false;
  }

 private:
  std::shared_ptr<FakeLink> link_;
};

void FakeLink::QueueSend(std::vector<std::string> parts) {
  absl::MutexLock lock(&mu_);
  queued_.push_back(std::move(parts));
}

void FakeLink::SetJoins(bool joins) {
  absl::MutexLock lock(&mu_);
  joins_ = joins;
}

void FakeLink::FailNextRecv() {
  absl::MutexLock lock(&mu_);
  fail_ = true;
}

int FakeLink::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

int FakeLink::receives() const {
  absl::MutexLock lock(&mu_);
  return receives_;
}

absl::StatusOr<std::unique_ptr<Transport>> FakeTransportFactory::Connect(absl::string_view peer_id, int) {
  if (peer_id.empty()) return absl::InvalidArgumentError("nccl_unique_id is empty");
  return std::unique_ptr<Transport>(new FakeTransport(link(peer_id)));
}

std::shared_ptr<FakeLink> FakeTransportFactory::link(absl::string_view peer_id) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<FakeLink>& l = links_[std::string(peer_id)];
  if (l == nullptr) l = std::make_shared<FakeLink>();
  return l;
}

}  // namespace driftkv
