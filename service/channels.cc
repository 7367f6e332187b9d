#include "service/channels.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "wire/tensor.h"

namespace driftkv {

struct ChannelManager::Channel {
  uint64_t id = 0;
  std::string tenant;
  std::unique_ptr<Transport> transport;
  absl::Mutex mu;  // one chunk at a time
  std::atomic<bool> busy{false};
  std::atomic<bool> ended{false};
  bool connected ABSL_GUARDED_BY(mu) = false;
  std::unique_ptr<StagingBuffer> staging ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> last_used_ns{0};
};

namespace {

// Polls `done` until it answers true, fails, or `deadline` passes
// (DeadlineExceeded): a short spin first (a transfer of a few MiB is over
// in microseconds over NVLink), then 50 us naps.
template <typename Poll>
absl::Status PollUntil(absl::Time deadline, Poll done) {
  for (int i = 0;; ++i) {
    absl::StatusOr<bool> st = done();
    if (!st.ok()) return st.status();
    if (*st) return absl::OkStatus();
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("");
    if (i < 2000) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
  }
}

}  // namespace

ChannelManager::ChannelManager(Handler* handler, TransportFactory* factory)
    : handler_(handler), factory_(factory), options_(handler->options()) {}

ChannelManager::~ChannelManager() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, channel] : channels_) channel->transport->Abort();
}

std::shared_ptr<ChannelManager::Channel> ChannelManager::Find(uint64_t id, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(id);
  return it == channels_.end() || it->second->tenant != tenant ? nullptr : it->second;
}

void ChannelManager::End(const std::shared_ptr<Channel>& channel, Ending why) {
  if (channel->ended.exchange(true)) return;
  channel->transport->Abort();
  {
    absl::MutexLock lock(&mu_);
    channels_.erase(channel->id);
  }
  if (why == Ending::kAborted) ++aborted_;
  if (why == Ending::kIdle) ++idle_closed_;
}

absl::Status ChannelManager::Open(const v1::OpenChannelRequest& r, v1::OpenChannelResponse* response,
                                  const std::string& tenant) {
  if (factory_ == nullptr) {
    return absl::UnimplementedError("this server has no NCCL transport (driftkv-server-cuda has one)");
  }
  if (r.nccl_version() != factory_->version()) {
    return absl::FailedPreconditionError(absl::StrCat("nccl_version ", r.nccl_version(),
                                                      " of the client differs from the server's ", factory_->version(),
                                                      ": both processes must load the same libnccl (docs/nccl.md)"));
  }
  const int device = handler_->backend().staging_device();
  if (factory_->needs_device_memory() && device < 0) {
    return absl::FailedPreconditionError(absl::StrCat("backend ", handler_->backend().name(),
                                                      " has no device memory to receive into; use backend cuda"));
  }
  auto channel = std::make_shared<Channel>();
  const uint64_t cap = options_.QuotaOf(tenant).max_nccl_channels;
  {
    absl::MutexLock lock(&mu_);
    // The tenant's own cap first: it names what the caller can change.
    if (const int64_t held = OpenLocked(tenant); cap > 0 && static_cast<uint64_t>(held) >= cap) {
      return QuotaExhausted(tenant, "max_nccl_channels", cap, absl::StrCat(held, " open channels"), "1 more",
                            "close one (CloseChannel) or wait for idle ones to close, or raise the quota");
    }
    if (static_cast<int>(channels_.size()) >= options_.nccl_max_channels) {
      return absl::ResourceExhaustedError(absl::StrCat(channels_.size(), " channels are open, nccl_max_channels is ",
                                                       options_.nccl_max_channels,
                                                       "; close one (CloseChannel) or wait for idle ones to close"));
    }
    absl::StatusOr<std::unique_ptr<Transport>> t = factory_->Connect(r.nccl_unique_id(), device);
    if (!t.ok()) return t.status();
    channel->transport = *std::move(t);
    channel->id = next_id_++;
    channel->tenant = tenant;
    channel->last_used_ns = absl::ToUnixNanos(absl::Now());
    channels_[channel->id] = channel;
  }
  ++opened_;
  response->set_channel_id(channel->id);
  response->set_nccl_version(factory_->version());
  response->set_device(device);
  response->set_chunk_timeout_seconds(options_.nccl_chunk_timeout_seconds);
  response->set_idle_seconds(options_.nccl_idle_seconds);
  response->set_max_chunk_bytes(options_.nccl_max_chunk_bytes);
  return absl::OkStatus();
}

absl::Status ChannelManager::Receive(Channel* c, uint64_t tb, absl::Time deadline) {
  const std::string where = absl::StrCat("channel ", c->id, ": ");
  if (!c->connected) {
    absl::Status st = PollUntil(deadline, [&] { return c->transport->Connected(); });
    if (absl::IsDeadlineExceeded(st)) {
      return absl::DeadlineExceededError(absl::StrCat(where, "the client did not join the communicator in time"));
    }
    if (!st.ok()) return absl::UnavailableError(absl::StrCat(where, "joining failed: ", st.message()));
    c->connected = true;
  }
  if (c->staging == nullptr || c->staging->bytes() < 2 * tb) {
    c->staging.reset();
    absl::StatusOr<std::unique_ptr<StagingBuffer>> s = handler_->backend().AllocateStaging(2 * tb);
    if (!s.ok())
      return absl::ResourceExhaustedError(absl::StrCat(where, "staging of ", 2 * tb, " bytes: ", s.status().message()));
    c->staging = *std::move(s);
  }
  uint8_t* base = static_cast<uint8_t*>(c->staging->data());
  const TransportBuffer parts[2] = {{base, tb}, {base + tb, tb}};
  absl::Status st = c->transport->StartRecv(parts);
  if (st.ok()) st = PollUntil(deadline, [&] { return c->transport->RecvDone(); });
  if (absl::IsDeadlineExceeded(st)) {
    return absl::DeadlineExceededError(
        absl::StrCat(where, "the chunk's ", 2 * tb, " bytes did not arrive by its deadline"));
  }
  if (!st.ok()) return absl::UnavailableError(absl::StrCat(where, "the transfer failed: ", st.message()));
  return absl::OkStatus();
}

absl::Status ChannelManager::Push(const v1::PushChunkRequest& r, absl::Time rpc_deadline, v1::AppendResponse* response,
                                  const std::string& tenant) {
  std::shared_ptr<Channel> c = Find(r.channel_id(), tenant);
  if (c == nullptr) {
    return absl::NotFoundError(absl::StrCat("channel_id ", r.channel_id(),
                                            " is not open (never opened, closed, aborted or closed when idle)"));
  }
  const std::string aborted = absl::StrCat("; channel ", c->id, " is aborted and nothing of the chunk is stored");
  if (c->busy.exchange(true)) {
    End(c, Ending::kAborted);
    return absl::FailedPreconditionError(
        absl::StrCat("channel ", c->id, " already has a chunk in flight (one at a time)", aborted));
  }
  struct Idle {
    Channel* c;
    ~Idle() { c->busy = false; }
  } idle{c.get()};
  absl::MutexLock lock(&c->mu);
  if (c->ended) return absl::NotFoundError(absl::StrCat("channel_id ", c->id, " is not open"));
  // Framing: what the client is sending must be receivable, or the
  // channel cannot go on.
  const size_t elements = static_cast<size_t>(r.token_count()) * handler_->codec().n();
  absl::Status st =
      r.token_count() == 0
          ? absl::InvalidArgumentError("token_count 0 must be >= 1")
          : CheckTensorBytes("tensor_bytes", r.dtype(), r.tensor_bytes(), elements,
                             absl::StrCat("token_count ", r.token_count(), " x n ", handler_->codec().n()));
  if (st.ok() && 2 * r.tensor_bytes() > options_.nccl_max_chunk_bytes) {
    st = absl::InvalidArgumentError(absl::StrCat("tensor_bytes ", r.tensor_bytes(),
                                                 ": keys + values exceed nccl_max_chunk_bytes ",
                                                 options_.nccl_max_chunk_bytes));
  }
  if (!st.ok()) {
    End(c, Ending::kAborted);
    return absl::Status(st.code(), absl::StrCat(st.message(), aborted));
  }
  const absl::Time deadline = std::min(rpc_deadline, absl::Now() + absl::Seconds(options_.nccl_chunk_timeout_seconds));
  st = Receive(c.get(), r.tensor_bytes(), deadline);
  if (!st.ok()) {
    End(c, Ending::kAborted);
    return absl::Status(st.code(), absl::StrCat(st.message(), aborted));
  }
  c->last_used_ns = absl::ToUnixNanos(absl::Now());
  StagedTokens t;
  t.keys = c->staging->data();
  t.values = static_cast<uint8_t*>(c->staging->data()) + r.tensor_bytes();
  t.dtype = r.dtype();
  t.tokens = r.token_count();
  st = handler_->AppendStaged(r, t, response, c->tenant);
  c->last_used_ns = absl::ToUnixNanos(absl::Now());
  if (st.ok()) {
    ++chunks_;
  }
  return st;
}

absl::Status ChannelManager::Close(const v1::CloseChannelRequest& r, v1::CloseChannelResponse*,
                                   const std::string& tenant) {
  std::shared_ptr<Channel> c = Find(r.channel_id(), tenant);
  if (c == nullptr) return absl::NotFoundError(absl::StrCat("channel_id ", r.channel_id(), " is not open"));
  End(c, Ending::kClosed);
  return absl::OkStatus();
}

int ChannelManager::CloseIdle() {
  const int64_t limit = absl::ToUnixNanos(absl::Now() - absl::Seconds(options_.nccl_idle_seconds));
  std::vector<std::shared_ptr<Channel>> idle;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, c] : channels_) {
      if (!c->busy && c->last_used_ns < limit) idle.push_back(c);
    }
  }
  for (const std::shared_ptr<Channel>& c : idle) End(c, Ending::kIdle);
  return static_cast<int>(idle.size());
}

void ChannelManager::Info(v1::InfoResponse* r) const {
  r->set_nccl_version(factory_ != nullptr ? factory_->version() : 0);
  r->set_nccl_max_channels(options_.nccl_max_channels);
  r->set_nccl_chunk_timeout_seconds(options_.nccl_chunk_timeout_seconds);
  r->set_nccl_idle_seconds(options_.nccl_idle_seconds);
  r->set_nccl_max_chunk_bytes(options_.nccl_max_chunk_bytes);
}

int64_t ChannelManager::OpenLocked(const std::string& tenant) const {
  int64_t open = 0;
  for (const auto& [id, c] : channels_) open += c->tenant == tenant ? 1 : 0;
  return open;
}

void ChannelManager::Stats(v1::StatsResponse* r, const std::string& tenant) const {
  {
    absl::MutexLock lock(&mu_);
    r->set_nccl_channels_open(channels_.size());
    r->set_tenant_nccl_channels(OpenLocked(tenant));
  }
  r->set_tenant_max_nccl_channels(options_.QuotaOf(tenant).max_nccl_channels);
  r->set_nccl_channels_opened(opened_);
  r->set_nccl_channels_aborted(aborted_);
  r->set_nccl_channels_idle_closed(idle_closed_);
  r->set_nccl_chunks(chunks_);
}

}  // namespace driftkv
