// driftkv::Client: the C++ client library of driftkv.v1.KvCache.
//
// Every call has a deadline (ClientOptions::timeout, per attempt) and
// returns absl::StatusOr with the server's status code and message.
// Retries happen only where repeating the call is harmless, and only on
// UNAVAILABLE (the request may not have reached the server, or its answer
// was lost):
//   Append   retried: chunks carry token positions, and tokens already
//            stored are acknowledged without storing them again;
//   Attend   retried when no item appends a token, or every item that does
//            sets new_token_index; otherwise never (a repeat would append twice);
//   Read     retried, resuming after the last chunk received;
//   Release  retried; NOT_FOUND on a repeat means the first attempt freed it;
//   Fork     never (a repeat after a lost answer is ALREADY_EXISTS; Length
//            of the new id tells whether the first attempt created it);
//   Lookup, Length, Info, Stats, Prefetch retried.
// Thread-safe: one Client may be shared by many threads.
//
// Security (docs/security.md): TLS when tls_ca_file is set (the server's CA),
// a client certificate for mTLS with tls_cert_file + tls_key_file, and a
// bearer token with `token` (needs TLS: tokens are never sent in
// plaintext). A file that cannot be read makes every call fail with
// INVALID_ARGUMENT naming it; nothing falls back to plaintext.
#ifndef DRIFTKV_CLIENT_CLIENT_H_
#define DRIFTKV_CLIENT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "proto/driftkv.grpc.pb.h"

namespace driftkv {

struct ClientOptions {
  std::string target = "127.0.0.1:50051";
  absl::Duration timeout = absl::Seconds(30);  // deadline of each attempt
  int max_attempts = 4;                        // retried calls: first try + 3 retries
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(1);
  int max_message_bytes = 64 << 20;  // send and receive limit
  std::string tls_ca_file;           // PEM roots that sign the server's certificate; set: TLS
  std::string tls_cert_file;         // PEM client certificate (mTLS), with tls_key_file
  std::string tls_key_file;
  std::string tls_server_name;  // expected name in the server's certificate (default: target's host)
  std::string token;            // bearer token ("authorization: Bearer TOKEN"); needs TLS
  // The data plane's inline door (docs/data_plane.md, "A polling door for
  // inline Attend"). read_chunk_bytes > 0: gRPC reads the socket this much
  // at a time (as the server's grpc_read_chunk_bytes). poll_attend: Attend
  // waits for its answer by polling instead of sleeping, keeping the
  // calling thread's core busy for the call's length.
  int read_chunk_bytes = 0;
  bool poll_attend = false;
  // > 0: the HTTP/2 window the client offers the server for answers
  // (grpc.http2.lookahead_bytes); 0: gRPC's, which starts at 64 KiB and
  // grows as its bandwidth probe sees traffic, so the first large answer
  // on a channel waits for window updates.
  int http2_window_bytes = 0;
};

// The channel that `options` describe; INVALID_ARGUMENT naming a file that
// cannot be read or a token without TLS.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeClientChannel(const ClientOptions& options);

class Client {
 public:
  explicit Client(ClientOptions options);
  // Over an existing channel (tests: in-process servers).
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // Streams `chunks` in one Append call.
  absl::StatusOr<v1::AppendResponse> Append(absl::Span<const v1::AppendChunk> chunks);

  // Append over up to `streams` concurrent calls, chunks grouped by layer
  // (layer % streams), each group in its original order. Layers are
  // independent in the service, so this is the same as Append(chunks) but
  // lets the server encode several layers at once. Totals are summed; on
  // failure the first error is returned (other groups may have been stored:
  // resend, it is idempotent).
  absl::StatusOr<v1::AppendResponse> AppendConcurrently(absl::Span<const v1::AppendChunk> chunks, int streams);

  // An open Append stream, for chunks produced over time (layer-wise ingest
  // while the prefill still runs). Not retried: when Finish fails with
  // UNAVAILABLE, resend the chunks with Append() (stored tokens are only
  // acknowledged). The deadline covers the whole stream. Not thread-safe.
  class AppendStream {
   public:
    // False when the server has ended the call; Finish() says why.
    bool Write(const v1::AppendChunk& chunk);
    absl::StatusOr<v1::AppendResponse> Finish();

   private:
    friend class Client;
    AppendStream() = default;
    grpc::ClientContext context_;
    absl::Status error_;  // the client's init_status_: nothing is sent
    v1::AppendResponse response_;
    std::unique_ptr<grpc::ClientWriter<v1::AppendChunk>> writer_;
    bool finished_ = false;
  };
  // `stream_timeout` bounds the whole stream (default: options().timeout).
  std::unique_ptr<AppendStream> OpenAppend(absl::Duration stream_timeout = absl::ZeroDuration());
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request);
  // Attend with the inline tensors in the caller's memory instead of the
  // messages (docs/data_plane.md, "Inline tensors in the caller's memory"):
  // item i's query is queries[i] (its `query` field then empty; an empty
  // view or an item past the end: the item's own query or reference), sent
  // from where it lies; the answer's output i is copied into outputs[i],
  // which must hold exactly its bytes, and left out of result i (an empty
  // span or an item past the end: kept in the result). The memory must
  // stay valid until the call returns. Retried as Attend(request).
  // INVALID_ARGUMENT before sending for a query given twice or more spans
  // than items; FAILED_PRECONDITION naming the item for a span of the
  // wrong size (after the call: its decode steps are stored).
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Span<const absl::string_view> queries,
                                            absl::Span<const absl::Span<char>> outputs);
  // Collects every chunk of the answer.
  absl::StatusOr<std::vector<v1::ReadChunk>> Read(const v1::ReadRequest& request);
  absl::StatusOr<v1::ReleaseResponse> Release(const std::string& sequence_id);
  // Token counts of every layer of a sequence (retried: read-only).
  absl::StatusOr<v1::LengthResponse> Length(const std::string& sequence_id);
  // Brings a sequence's pages back into the pool from the disk level
  // (docs/tiers.md) before an Attend; retried: idempotent.
  absl::StatusOr<v1::PrefetchResponse> Prefetch(const std::string& sequence_id);
  // Creates `sequence_id` sharing the first `tokens` tokens (a multiple of
  // page_tokens) of every layer of `source_sequence_id` (docs/api.md,
  // "Fork"); append to it from token `tokens` on. Not retried.
  absl::StatusOr<v1::ForkResponse> Fork(const std::string& source_sequence_id, const std::string& sequence_id,
                                        uint64_t tokens, bool new_incarnation = false);
  // Creates `sequence_id` sharing the longest prefix of the prompt
  // `token_ids` that the server's prefix index holds in every layer
  // (docs/api.md, "Fork from a prefix"), at most `max_tokens` tokens
  // unless 0; the answer's `tokens` says how many (append from there).
  // NOT_FOUND when none is held. Not retried.
  absl::StatusOr<v1::ForkResponse> ForkFromPrefix(absl::Span<const uint32_t> token_ids, const std::string& sequence_id,
                                                  uint64_t max_tokens = 0, bool new_incarnation = false);
  // The longest prefix of the prompt `token_ids` the server holds, per
  // layer and overall, and why the next page is not (docs/api.md,
  // "Lookup"). Retried: read-only.
  absl::StatusOr<v1::LookupResponse> Lookup(absl::Span<const uint32_t> token_ids);
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& request);
  // Pins the longest prefix of `token_ids` the server holds in every layer
  // (at most `max_tokens` unless 0) for `ttl_seconds`, as `pin_id`
  // (docs/api.md, "Pin"); repeating it renews the pin. Retried (a repeat
  // replaces the pin with itself).
  absl::StatusOr<v1::PinResponse> Pin(const std::string& pin_id, absl::Span<const uint32_t> token_ids,
                                      double ttl_seconds, uint64_t max_tokens = 0);
  // Removes a pin; NOT_FOUND when it is not live. Not retried. (Page
  // events: stub()->WatchPages, a server stream; docs/api.md.)
  absl::StatusOr<v1::UnpinResponse> Unpin(const std::string& pin_id);
  absl::StatusOr<v1::InfoResponse> Info();
  absl::StatusOr<v1::StatsResponse> Stats();

  // Reconstructed keys/values of one layer as float [tokens][kv_heads][head_dim].
  struct Tensors {
    std::vector<float> keys, values;
    uint64_t tokens = 0;
    uint64_t compressed_tokens = 0;
  };
  absl::StatusOr<Tensors> ReadFloat(const std::string& sequence_id, uint32_t layer, uint64_t first_token,
                                    uint64_t token_count);

  // Attempts beyond the first, over the client's life (tests, diagnostics).
  int64_t retries() const { return retries_.load(); }
  const ClientOptions& options() const { return options_; }
  // The stub, for protocols built over it (client/nccl_channel.h).
  v1::KvCache::Stub* stub() { return stub_.get(); }

 private:
  // Runs `call` up to max_attempts times while it answers UNAVAILABLE
  // (only once when `idempotent` is false), with exponential backoff.
  template <typename Call>
  grpc::Status WithRetries(bool idempotent, Call call);
  void SetDeadline(grpc::ClientContext* context) const;
  // Fork and ForkFromPrefix: one Fork RPC, never retried (a repeat after a
  // lost answer would be ALREADY_EXISTS).
  absl::StatusOr<v1::ForkResponse> SendFork(const v1::ForkRequest& request);

  ClientOptions options_;
  absl::Status init_status_;  // MakeClientChannel's error: every call returns it
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  std::atomic<int64_t> retries_{0};
};

// Builds one Append chunk from float tokens [count][n], converted to `dtype`,
// with its crc32c set (wire/crc32c.h). Append, AppendConcurrently and
// AppendStream::Write also set it on a chunk that lacks it (on a copy),
// unless its keys and values are by reference (keys_ref/values_ref).
// The chunk's CRC-32C over keys then values (AppendChunk.crc32c).
uint32_t ChunkCrc32c(const v1::AppendChunk& chunk);

// `token_ids`: the chunk's tokens' ids (count of them, AppendChunk.token_ids)
// or none.
v1::AppendChunk MakeChunk(const std::string& sequence_id, uint32_t layer, uint64_t first_token, uint32_t count,
                          const float* keys, const float* values, size_t n, v1::DType dtype,
                          absl::Span<const uint32_t> token_ids = {});

// Output floats of one AttendResult ([q_heads][head_dim]).
std::vector<float> OutputFloats(const v1::AttendResult& result);

// grpc::Status -> absl::Status (same code numbers), message kept.
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_CLIENT_H_
