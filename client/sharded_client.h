// driftkv::ShardedClient: one client over N driftkv-server replicas, each
// sequence pinned to one replica by rendezvous (highest random weight)
// hashing of its sequence_id.
//
// Why client-side: every replica holds its own pool, so all calls of a
// sequence must reach the replica that holds it, and one Attend batch mixes
// sequences of several replicas. Without xDS or a proxy that understands
// driftkv, the client splits the batch itself (docs/operations.md, "Scale
// out").
//
// Invariants:
//  - The owner of a sequence depends only on its id and the set of replica
//    names: Owner = argmax over replicas r of RendezvousScore(r, id), ties to
//    the smaller name. Every client given the same names routes the same way,
//    whatever the order of the list. The names are the strings given
//    ("driftkv-server-0.driftkv-headless.ns.svc.cluster.local:50051"), so all
//    clients must spell them alike (the StatefulSet's stable DNS names).
//  - Removing a replica moves exactly that replica's sequences (spread over
//    the others); adding one moves to it only the sequences it now wins.
//  - RendezvousScore(r, id) = Mix64(Fnv1a64(r + '\0' + id)): FNV-1a 64 over
//    the UTF-8 bytes of the name, one zero byte and the id, then the
//    SplitMix64 finaliser. Other clients (Python) implement exactly this.
//  - Per-sequence calls (Read, ReadFloat, Release, Length) go to the owner
//    only; their errors carry the replica's name ("replica NAME: ...").
//  - Prefixes across replicas: a replica's prefix index holds the pages of
//    the sequences it held, so a new sequence reuses a prompt's prefix only
//    on a replica that has it. ForkFromPrefix asks every replica (Lookup),
//    takes the one with the longest prefix (ties to the lower index) and
//    forks there under an id that routes to it: the first of `base`,
//    `base~1`, `base~2`, ... whose owner it is (SequenceIdOn; the Python
//    client derives the same ids), so every later call of that id finds it.
//  - Nothing moves data between replicas. A replica that is down fails the
//    calls of its own sequences (UNAVAILABLE after the per-replica client's
//    retries: the caller recomputes those sequences, e.g. re-runs their
//    prefill on the list without that replica); every other sequence keeps
//    working.
//
// Thread-safe: one ShardedClient may be shared by many threads.
#ifndef DRIFTKV_CLIENT_SHARDED_CLIENT_H_
#define DRIFTKV_CLIENT_SHARDED_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace driftkv {

// FNV-1a 64 of `bytes`, continuing from `state` (the FNV offset basis).
uint64_t Fnv1a64(absl::string_view bytes, uint64_t state = 0xcbf29ce484222325ull);
// The SplitMix64 finaliser: a bijection of 64 bits with full avalanche.
uint64_t Mix64(uint64_t x);
// The weight of `replica` for `sequence_id` (see the invariants above).
uint64_t RendezvousScore(absl::string_view replica, absl::string_view sequence_id);
// The index in `replicas` of the owner of `sequence_id`; -1 when empty.
int RendezvousOwner(absl::Span<const std::string> replicas, absl::string_view sequence_id);

// "a:1,b:2, c:3" -> {"a:1", "b:2", "c:3"} (empty entries dropped).
std::vector<std::string> SplitReplicas(absl::string_view list);

class ShardedClient {
 public:
  // One Client per replica, each with `options` (its target replaced by the
  // replica). The names must be distinct.
  ShardedClient(std::vector<std::string> replicas, ClientOptions options = {});
  // Over existing clients, named for hashing by `replicas` (tests).
  ShardedClient(std::vector<std::string> replicas, std::vector<std::unique_ptr<Client>> clients);

  int replica_count() const { return static_cast<int>(replicas_.size()); }
  const std::vector<std::string>& replicas() const { return replicas_; }
  Client& replica(int index) { return *clients_[index]; }
  // The index of the replica that holds `sequence_id`.
  int ReplicaOf(absl::string_view sequence_id) const;

  // Chunks grouped by owner (each group in its original order), one Append
  // call per replica, concurrently. Totals are summed. On failure the first
  // error, its message prefixed with the replica; the other replicas' chunks
  // were stored (resend: Append is idempotent).
  absl::StatusOr<v1::AppendResponse> Append(absl::Span<const v1::AppendChunk> chunks);

  // An Attend batch split by owner, the sub-batches sent concurrently, the
  // results put back in request order. `status[i]` is item i's: OK, or the
  // status of its replica's sub-batch (a batch is all-or-nothing on one
  // replica, so one bad item fails the items that share its replica).
  // `response.results(i)` is empty where `status[i]` is not OK.
  struct AttendOutcome {
    v1::AttendResponse response;
    std::vector<absl::Status> status;
    bool ok() const;
    absl::Status FirstError() const;  // OK when ok()
  };
  // With `queries` and `outputs`: each replica's sub-batch through
  // Client::Attend with the inline tensors in the caller's memory (item i's
  // query from queries[i], its output into outputs[i]; client/client.h).
  // A mistake in the spans (a query given twice, more spans than items)
  // fails every item before anything is sent.
  AttendOutcome AttendEach(const v1::AttendRequest& request, absl::Span<const absl::string_view> queries = {},
                           absl::Span<const absl::Span<char>> outputs = {});
  // The same, all or nothing: the first failed item's status.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Span<const absl::string_view> queries = {},
                                            absl::Span<const absl::Span<char>> outputs = {});

  absl::StatusOr<std::vector<v1::ReadChunk>> Read(const v1::ReadRequest& request);
  absl::StatusOr<Client::Tensors> ReadFloat(const std::string& sequence_id, uint32_t layer, uint64_t first_token,
                                            uint64_t token_count);
  absl::StatusOr<v1::ReleaseResponse> Release(const std::string& sequence_id);
  // Each layer's stored tokens, asked of the sequence's replica (NOT_FOUND
  // there when it does not hold it, e.g. after a restart or a list change).
  absl::StatusOr<v1::LengthResponse> Length(const std::string& sequence_id);

  // Every replica's answer, in replica order.
  std::vector<absl::StatusOr<v1::InfoResponse>> InfoAll();
  std::vector<absl::StatusOr<v1::StatsResponse>> StatsAll();
  std::vector<absl::StatusOr<v1::LookupResponse>> LookupAll(const v1::LookupRequest& request);

  // The index of the answer with the most tokens held in every layer (ties
  // to the lower index); -1 when none holds a page (failed answers count as
  // none).
  static int LongestPrefix(const std::vector<absl::StatusOr<v1::LookupResponse>>& answers);
  // The first of base, base~1, base~2, ... that `replica` owns. REQUIRES:
  // 0 <= replica < replica_count().
  std::string SequenceIdOn(absl::string_view base, int replica) const;
  // A sequence made from the longest prefix any replica holds (see the
  // invariants): its id (from `base`), its replica and the Fork's answer
  // (`tokens`: append from there). NOT_FOUND when no replica holds a page
  // of the prompt (then make `base` itself, which routes to its owner);
  // a failed Lookup of one replica only leaves it out. Not retried.
  struct PrefixFork {
    std::string sequence_id;
    int replica = -1;
    v1::ForkResponse response;
  };
  absl::StatusOr<PrefixFork> ForkFromPrefix(absl::Span<const uint32_t> token_ids, absl::string_view base,
                                            uint64_t max_tokens = 0);

 private:
  // `status` with "replica NAME: " before its message.
  absl::Status Named(int replica, const absl::Status& status) const;

  std::vector<std::string> replicas_;
  std::vector<std::unique_ptr<Client>> clients_;
};

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_SHARDED_CLIENT_H_
