#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include <grpc/support/time.h>
#include <grpcpp/completion_queue.h>

#include "absl/time/clock.h"
#include "client/attend_tensors.h"
#include "wire/crc32c.h"
#include "wire/tensor.h"
#include "wire/text_file.h"

namespace driftkv {
namespace {

// Writes `c`, with its crc32c set when it lacks one and carries its keys
// and values inline (the server refuses a crc32c beside keys_ref/values_ref:
// it covers inline bytes only).
bool WriteWithCrc(grpc::ClientWriter<v1::AppendChunk>* writer, const v1::AppendChunk& c) {
  if (c.has_crc32c() || c.has_keys_ref() || c.has_values_ref()) return writer->Write(c);
  v1::AppendChunk copy = c;
  copy.set_crc32c(ChunkCrc32c(c));
  return writer->Write(copy);
}

// A repeat would append a decode step twice unless every item that carries
// one names its token index.
bool AttendIsIdempotent(const v1::AttendRequest& request) {
  for (const v1::AttendItem& it : request.items()) {
    const bool step =
        !it.new_key().empty() || !it.new_value().empty() || it.has_new_key_ref() || it.has_new_value_ref();
    if (step && !it.has_new_token_index()) return false;
  }
  return true;
}

}  // namespace

uint32_t ChunkCrc32c(const v1::AppendChunk& c) {
  return Crc32cExtend(Crc32c(c.keys()), c.values().data(), c.values().size());
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeClientChannel(const ClientOptions& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(o.max_message_bytes);
  args.SetMaxSendMessageSize(o.max_message_bytes);
  if (o.http2_window_bytes > 0) args.SetInt("grpc.http2.lookahead_bytes", o.http2_window_bytes);
  if (o.read_chunk_bytes > 0) {
    args.SetInt("grpc.experimental.tcp_read_chunk_size", o.read_chunk_bytes);
    args.SetInt("grpc.experimental.tcp_min_read_chunk_size", o.read_chunk_bytes);
  }
  if (o.tls_ca_file.empty()) {
    if (!o.token.empty() || !o.tls_cert_file.empty()) {
      return absl::InvalidArgumentError(
          "a token or a client certificate needs TLS: set tls_ca_file (the CA of the server's certificate)");
    }
    return grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadNonEmptyFile(o.tls_ca_file, "tls_ca_file");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file: set both or neither");
  }
  if (!o.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadNonEmptyFile(o.tls_cert_file, "tls_cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadNonEmptyFile(o.tls_key_file, "tls_key_file");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (!o.token.empty()) creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(o.token));
  return grpc::CreateCustomChannel(o.target, creds, args);
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeClientChannel(options_);
  if (channel.ok()) {
    channel_ = *std::move(channel);
  } else {
    // Never used for a call (WithRetries returns init_status_ first).
    init_status_ = channel.status();
    channel_ = grpc::CreateChannel("unix:/nonexistent", grpc::InsecureChannelCredentials());
  }
  stub_ = v1::KvCache::NewStub(channel_);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)), channel_(std::move(channel)), stub_(v1::KvCache::NewStub(channel_)) {}

void Client::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(options_.timeout)));
}

template <typename Call>
grpc::Status Client::WithRetries(bool idempotent, Call call) {
  if (!init_status_.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(init_status_.code()), std::string(init_status_.message()));
  }
  const int attempts = idempotent ? std::max(1, options_.max_attempts) : 1;
  absl::Duration backoff = options_.initial_backoff;
  thread_local std::mt19937 rng(std::random_device{}());
  grpc::Status st;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      ++retries_;
      // Full jitter: sleep uniformly in [backoff / 2, backoff].
      std::uniform_real_distribution<double> jitter(0.5, 1.0);
      absl::SleepFor(backoff * jitter(rng));
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
    st = call(attempt);
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) return st;
  }
  return st;
}

absl::StatusOr<v1::AppendResponse> Client::Append(absl::Span<const v1::AppendChunk> chunks) {
  v1::AppendResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    std::unique_ptr<grpc::ClientWriter<v1::AppendChunk>> writer = stub_->Append(&context, &response);
    for (const v1::AppendChunk& c : chunks) {
      if (!WriteWithCrc(writer.get(), c)) break;  // the server ended the call; Finish says why
    }
    writer->WritesDone();
    return writer->Finish();
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::AppendResponse> Client::AppendConcurrently(absl::Span<const v1::AppendChunk> chunks, int streams) {
  streams = std::max(1, streams);
  std::vector<std::vector<v1::AppendChunk>> groups(streams);
  for (const v1::AppendChunk& c : chunks) groups[c.layer() % streams].push_back(c);
  std::vector<absl::StatusOr<v1::AppendResponse>> results(streams, v1::AppendResponse());
  std::vector<std::thread> threads;
  for (int g = 0; g < streams; ++g) {
    if (groups[g].empty()) continue;
    threads.emplace_back([&, g] { results[g] = Append(groups[g]); });
  }
  for (std::thread& t : threads) t.join();
  v1::AppendResponse total;
  for (const auto& r : results) {
    if (!r.ok()) return r.status();
    total.set_chunks(total.chunks() + r->chunks());
    total.set_tokens_stored(total.tokens_stored() + r->tokens_stored());
    total.set_tokens_duplicate(total.tokens_duplicate() + r->tokens_duplicate());
  }
  return total;
}

std::unique_ptr<Client::AppendStream> Client::OpenAppend(absl::Duration stream_timeout) {
  std::unique_ptr<AppendStream> s(new AppendStream());
  if (!init_status_.ok()) {
    s->error_ = init_status_;
    return s;
  }
  const absl::Duration t = stream_timeout > absl::ZeroDuration() ? stream_timeout : options_.timeout;
  s->context_.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(absl::ToInt64Microseconds(t)));
  s->writer_ = stub_->Append(&s->context_, &s->response_);
  return s;
}

bool Client::AppendStream::Write(const v1::AppendChunk& chunk) {
  return error_.ok() && !finished_ && WriteWithCrc(writer_.get(), chunk);
}

absl::StatusOr<v1::AppendResponse> Client::AppendStream::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  finished_ = true;
  if (!error_.ok()) return error_;
  writer_->WritesDone();
  grpc::Status st = writer_->Finish();
  if (!st.ok()) return FromGrpc(st);
  return response_;
}

absl::StatusOr<v1::AttendResponse> Client::Attend(const v1::AttendRequest& request) {
  v1::AttendResponse response;
  grpc::Status st = WithRetries(AttendIsIdempotent(request), [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    if (!options_.poll_attend) return stub_->Attend(&context, request, &response);
    // The same call through a queue of its own, asked with a zero timeout
    // until the answer is there: the socket's work runs on this thread,
    // which never sleeps in between.
    grpc::CompletionQueue cq;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::AttendResponse>> call =
        stub_->AsyncAttend(&context, request, &cq);
    call->Finish(&response, &status, &cq);
    AwaitOneAndDrain(&cq, true);
    return status;
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::AttendResponse> Client::Attend(const v1::AttendRequest& request,
                                                  absl::Span<const absl::string_view> queries,
                                                  absl::Span<const absl::Span<char>> outputs) {
  if (absl::Status c = CheckAttendTensors(request, queries, outputs); !c.ok()) return c;
  const grpc::ByteBuffer sent = AttendRequestBytes(request, queries);
  grpc::ByteBuffer received;
  grpc::Status st = WithRetries(AttendIsIdempotent(request), [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    received.Clear();
    return CallAttend(channel_, &context, options_.poll_attend, sent, &received);
  });
  if (!st.ok()) return FromGrpc(st);
  v1::AttendResponse response;
  if (absl::Status r = ReadAttendAnswer(received, request.items_size(), outputs, &response); !r.ok()) return r;
  return response;
}

absl::StatusOr<std::vector<v1::ReadChunk>> Client::Read(const v1::ReadRequest& request) {
  std::vector<v1::ReadChunk> chunks;
  uint64_t next = request.first_token();
  grpc::Status st = WithRetries(true, [&](int) {
    // Resume after the chunks already received.
    v1::ReadRequest resumed = request;
    resumed.set_first_token(next);
    if (request.token_count() != 0) {
      const uint64_t done = next - request.first_token();
      if (done == request.token_count()) return grpc::Status::OK;
      resumed.set_token_count(request.token_count() - done);
    }
    grpc::ClientContext context;
    SetDeadline(&context);
    std::unique_ptr<grpc::ClientReader<v1::ReadChunk>> reader = stub_->Read(&context, resumed);
    v1::ReadChunk chunk;
    while (reader->Read(&chunk)) {
      next = chunk.first_token() + chunk.token_count();
      chunks.push_back(std::move(chunk));
    }
    return reader->Finish();
  });
  if (!st.ok()) return FromGrpc(st);
  return chunks;
}

absl::StatusOr<v1::ReleaseResponse> Client::Release(const std::string& sequence_id) {
  v1::ReleaseRequest request;
  request.set_sequence_id(sequence_id);
  v1::ReleaseResponse response;
  grpc::Status st = WithRetries(true, [&](int attempt) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    grpc::Status s = stub_->Release(&context, request, &response);
    // A repeat that finds nothing: the lost first answer had freed it.
    if (attempt > 0 && s.error_code() == grpc::StatusCode::NOT_FOUND) return grpc::Status::OK;
    return s;
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::PrefetchResponse> Client::Prefetch(const std::string& sequence_id) {
  v1::PrefetchRequest request;
  request.set_sequence_id(sequence_id);
  v1::PrefetchResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    return stub_->Prefetch(&context, request, &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::LengthResponse> Client::Length(const std::string& sequence_id) {
  v1::LengthRequest request;
  request.set_sequence_id(sequence_id);
  v1::LengthResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    return stub_->Length(&context, request, &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::ForkResponse> Client::Fork(const std::string& source_sequence_id, const std::string& sequence_id,
                                              uint64_t tokens, bool new_incarnation) {
  v1::ForkRequest request;
  request.set_source_sequence_id(source_sequence_id);
  request.set_sequence_id(sequence_id);
  request.set_tokens(tokens);
  request.set_new_incarnation(new_incarnation);
  return SendFork(request);
}

absl::StatusOr<v1::ForkResponse> Client::SendFork(const v1::ForkRequest& request) {
  v1::ForkResponse response;
  grpc::Status st = WithRetries(false, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->Fork(&context, request, &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::ForkResponse> Client::ForkFromPrefix(absl::Span<const uint32_t> token_ids,
                                                        const std::string& sequence_id, uint64_t max_tokens,
                                                        bool new_incarnation) {
  v1::ForkRequest request;
  request.mutable_prefix_token_ids()->Add(token_ids.begin(), token_ids.end());
  request.set_sequence_id(sequence_id);
  request.set_tokens(max_tokens);
  request.set_new_incarnation(new_incarnation);
  return SendFork(request);
}

absl::StatusOr<v1::LookupResponse> Client::Lookup(absl::Span<const uint32_t> token_ids) {
  v1::LookupRequest request;
  request.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  return Lookup(request);
}

absl::StatusOr<v1::LookupResponse> Client::Lookup(const v1::LookupRequest& request) {
  v1::LookupResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    return stub_->Lookup(&context, request, &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::PinResponse> Client::Pin(const std::string& pin_id, absl::Span<const uint32_t> token_ids,
                                            double ttl_seconds, uint64_t max_tokens) {
  v1::PinRequest request;
  request.set_pin_id(pin_id);
  request.mutable_prefix_token_ids()->Add(token_ids.begin(), token_ids.end());
  request.set_ttl_seconds(ttl_seconds);
  request.set_tokens(max_tokens);
  v1::PinResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    response.Clear();
    return stub_->Pin(&context, request, &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::UnpinResponse> Client::Unpin(const std::string& pin_id) {
  v1::UnpinRequest request;
  request.set_pin_id(pin_id);
  v1::UnpinResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status st = stub_->Unpin(&context, request, &response);
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::InfoResponse> Client::Info() {
  v1::InfoResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->Info(&context, v1::InfoRequest(), &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<v1::StatsResponse> Client::Stats() {
  v1::StatsResponse response;
  grpc::Status st = WithRetries(true, [&](int) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->Stats(&context, v1::StatsRequest(), &response);
  });
  if (!st.ok()) return FromGrpc(st);
  return response;
}

absl::StatusOr<Client::Tensors> Client::ReadFloat(const std::string& sequence_id, uint32_t layer, uint64_t first_token,
                                                  uint64_t token_count) {
  v1::ReadRequest request;
  request.set_sequence_id(sequence_id);
  request.set_layer(layer);
  request.set_first_token(first_token);
  request.set_token_count(token_count);
  request.set_dtype(v1::DTYPE_F32);
  absl::StatusOr<std::vector<v1::ReadChunk>> chunks = Read(request);
  if (!chunks.ok()) return chunks.status();
  Tensors t;
  for (const v1::ReadChunk& c : *chunks) {
    const size_t floats = c.keys().size() / sizeof(float);
    const size_t at = t.keys.size();
    t.keys.resize(at + floats);
    t.values.resize(at + floats);
    std::memcpy(t.keys.data() + at, c.keys().data(), floats * sizeof(float));
    std::memcpy(t.values.data() + at, c.values().data(), floats * sizeof(float));
    t.tokens += c.token_count();
    t.compressed_tokens += c.compressed_tokens();
  }
  return t;
}

v1::AppendChunk MakeChunk(const std::string& sequence_id, uint32_t layer, uint64_t first_token, uint32_t count,
                          const float* keys, const float* values, size_t n, v1::DType dtype,
                          absl::Span<const uint32_t> token_ids) {
  v1::AppendChunk c;
  c.set_sequence_id(sequence_id);
  c.set_layer(layer);
  c.set_first_token(first_token);
  c.set_token_count(count);
  c.set_dtype(dtype);
  FloatToTensor(keys, static_cast<size_t>(count) * n, dtype, c.mutable_keys());
  FloatToTensor(values, static_cast<size_t>(count) * n, dtype, c.mutable_values());
  c.set_crc32c(ChunkCrc32c(c));
  c.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  return c;
}

std::vector<float> OutputFloats(const v1::AttendResult& result) {
  std::vector<float> out(result.output().size() / sizeof(float));
  std::memcpy(out.data(), result.output().data(), out.size() * sizeof(float));
  return out;
}

}  // namespace driftkv
