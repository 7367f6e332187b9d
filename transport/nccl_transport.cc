// The NCCL Transport (transport.h) and its registration as the default
// factory of driftkv-server-cuda.
#include "transport/nccl_comm.h"
#include "transport/transport.h"

namespace driftkv {
namespace {

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(std::unique_ptr<NcclComm> comm) : comm_(std::move(comm)) {}
  absl::StatusOr<bool> Connected() override { return comm_->Ready(); }
  absl::Status StartRecv(absl::Span<const TransportBuffer> parts) override { return comm_->Start(false, parts); }
  absl::StatusOr<bool> RecvDone() override { return comm_->Done(); }
  void Abort() override { comm_->Abort(); }

 private:
  std::unique_ptr<NcclComm> comm_;
};

class NcclTransportFactory : public TransportFactory {
 public:
  int version() const override { return NcclComm::Version(); }
  absl::StatusOr<std::unique_ptr<Transport>> Connect(absl::string_view peer_id, int device) override {
    absl::StatusOr<std::unique_ptr<NcclComm>> comm = NcclComm::Join(peer_id, 1, device);
    if (!comm.ok()) return comm.status();
    return std::unique_ptr<Transport>(new NcclTransport(*std::move(comm)));
  }
};

const bool kRegistered = RegisterDefaultTransportFactory(new NcclTransportFactory());

}  // namespace
}  // namespace driftkv
