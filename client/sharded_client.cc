#include "client/sharded_client.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/attend_tensors.h"

namespace driftkv {
namespace {

// Runs fn(i) for every i in `indexes` at once: one on the calling thread,
// the others on threads of their own (a call waits for the network, so a
// thread per replica is what concurrency costs here).
template <typename Fn>
void ForEachConcurrently(const std::vector<int>& indexes, Fn fn) {
  std::vector<std::thread> threads;
  for (size_t k = 1; k < indexes.size(); ++k) threads.emplace_back([&fn, i = indexes[k]] { fn(i); });
  if (!indexes.empty()) fn(indexes[0]);
  for (std::thread& t : threads) t.join();
}

}  // namespace

uint64_t Fnv1a64(absl::string_view bytes, uint64_t state) {
  for (unsigned char c : bytes) {
    state ^= c;
    state *= 0x100000001b3ull;  // the FNV-1a 64 prime
  }
  return state;
}

uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t RendezvousScore(absl::string_view replica, absl::string_view sequence_id) {
  uint64_t h = Fnv1a64(replica);
  h = Fnv1a64(absl::string_view("\0", 1), h);
  return Mix64(Fnv1a64(sequence_id, h));
}

int RendezvousOwner(absl::Span<const std::string> replicas, absl::string_view sequence_id) {
  int best = -1;
  uint64_t best_score = 0;
  for (int i = 0; i < static_cast<int>(replicas.size()); ++i) {
    const uint64_t s = RendezvousScore(replicas[i], sequence_id);
    if (best < 0 || s > best_score || (s == best_score && replicas[i] < replicas[best])) {
      best = i;
      best_score = s;
    }
  }
  return best;
}

std::vector<std::string> SplitReplicas(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view r : absl::StrSplit(list, ',')) {
    r = absl::StripAsciiWhitespace(r);
    if (!r.empty()) out.emplace_back(r);
  }
  return out;
}

ShardedClient::ShardedClient(std::vector<std::string> replicas, ClientOptions options)
    : replicas_(std::move(replicas)) {
  for (const std::string& r : replicas_) {
    ClientOptions o = options;
    o.target = r;
    clients_.push_back(std::make_unique<Client>(o));
  }
}

ShardedClient::ShardedClient(std::vector<std::string> replicas, std::vector<std::unique_ptr<Client>> clients)
    : replicas_(std::move(replicas)), clients_(std::move(clients)) {}

int ShardedClient::ReplicaOf(absl::string_view sequence_id) const {
  return RendezvousOwner(replicas_, sequence_id);
}

absl::Status ShardedClient::Named(int replica, const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("replica ", replicas_[replica], ": ", status.message()));
}

absl::StatusOr<v1::AppendResponse> ShardedClient::Append(absl::Span<const v1::AppendChunk> chunks) {
  if (replicas_.empty()) return absl::FailedPreconditionError("ShardedClient has no replicas");
  std::vector<std::vector<v1::AppendChunk>> groups(replicas_.size());
  for (const v1::AppendChunk& c : chunks) groups[ReplicaOf(c.sequence_id())].push_back(c);
  std::vector<int> used;
  for (int r = 0; r < replica_count(); ++r) {
    if (!groups[r].empty()) used.push_back(r);
  }
  std::vector<absl::StatusOr<v1::AppendResponse>> results(replicas_.size(), v1::AppendResponse());
  ForEachConcurrently(used, [&](int r) { results[r] = clients_[r]->Append(groups[r]); });
  v1::AppendResponse total;
  for (int r : used) {
    if (!results[r].ok()) return Named(r, results[r].status());
    total.set_chunks(total.chunks() + results[r]->chunks());
    total.set_tokens_stored(total.tokens_stored() + results[r]->tokens_stored());
    total.set_tokens_duplicate(total.tokens_duplicate() + results[r]->tokens_duplicate());
  }
  return total;
}

bool ShardedClient::AttendOutcome::ok() const {
  return FirstError().ok();
}

absl::Status ShardedClient::AttendOutcome::FirstError() const {
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

ShardedClient::AttendOutcome ShardedClient::AttendEach(const v1::AttendRequest& request,
                                                       absl::Span<const absl::string_view> queries,
                                                       absl::Span<const absl::Span<char>> outputs) {
  const int items = request.items_size();
  AttendOutcome out;
  out.status.assign(items, absl::OkStatus());
  for (int i = 0; i < items; ++i) out.response.add_results();
  if (replicas_.empty()) {
    out.status.assign(items, absl::FailedPreconditionError("ShardedClient has no replicas"));
    return out;
  }
  if (absl::Status c = CheckAttendTensors(request, queries, outputs); !c.ok()) {
    out.status.assign(items, c);
    return out;
  }
  const bool apart = !queries.empty() || !outputs.empty();
  // Sub-batch per replica, remembering each item's place in the request,
  // with its query and output spans when they are apart.
  std::vector<v1::AttendRequest> sub(replicas_.size());
  std::vector<std::vector<int>> where(replicas_.size());
  std::vector<std::vector<absl::string_view>> sub_queries(apart ? replicas_.size() : 0);
  std::vector<std::vector<absl::Span<char>>> sub_outputs(apart ? replicas_.size() : 0);
  for (int i = 0; i < items; ++i) {
    const int r = ReplicaOf(request.items(i).sequence_id());
    *sub[r].add_items() = request.items(i);
    where[r].push_back(i);
    if (apart) {
      const size_t k = static_cast<size_t>(i);
      sub_queries[r].push_back(k < queries.size() ? queries[k] : absl::string_view());
      sub_outputs[r].push_back(k < outputs.size() ? outputs[k] : absl::Span<char>());
    }
  }
  std::vector<int> used;
  for (int r = 0; r < replica_count(); ++r) {
    if (!where[r].empty()) used.push_back(r);
  }
  std::vector<absl::StatusOr<v1::AttendResponse>> answers(replicas_.size(), v1::AttendResponse());
  ForEachConcurrently(used, [&](int r) {
    answers[r] = apart ? clients_[r]->Attend(sub[r], sub_queries[r], sub_outputs[r]) : clients_[r]->Attend(sub[r]);
  });
  for (int r : used) {
    if (answers[r].ok() && answers[r]->results_size() != static_cast<int>(where[r].size())) {
      answers[r] =
          absl::InternalError(absl::StrCat(answers[r]->results_size(), " results for ", where[r].size(), " items"));
    }
    for (size_t k = 0; k < where[r].size(); ++k) {
      if (answers[r].ok()) {
        out.response.mutable_results(where[r][k])->Swap(answers[r]->mutable_results(static_cast<int>(k)));
      } else {
        out.status[where[r][k]] = Named(r, answers[r].status());
      }
    }
  }
  return out;
}

absl::StatusOr<v1::AttendResponse> ShardedClient::Attend(const v1::AttendRequest& request,
                                                         absl::Span<const absl::string_view> queries,
                                                         absl::Span<const absl::Span<char>> outputs) {
  AttendOutcome out = AttendEach(request, queries, outputs);
  absl::Status st = out.FirstError();
  if (!st.ok()) return st;
  return std::move(out.response);
}

absl::StatusOr<std::vector<v1::ReadChunk>> ShardedClient::Read(const v1::ReadRequest& request) {
  if (replicas_.empty()) return absl::FailedPreconditionError("ShardedClient has no replicas");
  const int r = ReplicaOf(request.sequence_id());
  absl::StatusOr<std::vector<v1::ReadChunk>> out = clients_[r]->Read(request);
  if (!out.ok()) return Named(r, out.status());
  return out;
}

absl::StatusOr<Client::Tensors> ShardedClient::ReadFloat(const std::string& sequence_id, uint32_t layer,
                                                         uint64_t first_token, uint64_t token_count) {
  if (replicas_.empty()) return absl::FailedPreconditionError("ShardedClient has no replicas");
  const int r = ReplicaOf(sequence_id);
  absl::StatusOr<Client::Tensors> out = clients_[r]->ReadFloat(sequence_id, layer, first_token, token_count);
  if (!out.ok()) return Named(r, out.status());
  return out;
}

absl::StatusOr<v1::ReleaseResponse> ShardedClient::Release(const std::string& sequence_id) {
  if (replicas_.empty()) return absl::FailedPreconditionError("ShardedClient has no replicas");
  const int r = ReplicaOf(sequence_id);
  absl::StatusOr<v1::ReleaseResponse> out = clients_[r]->Release(sequence_id);
  if (!out.ok()) return Named(r, out.status());
  return out;
}

absl::StatusOr<v1::LengthResponse> ShardedClient::Length(const std::string& sequence_id) {
  if (replicas_.empty()) return absl::FailedPreconditionError("ShardedClient has no replicas");
  const int r = ReplicaOf(sequence_id);
  absl::StatusOr<v1::LengthResponse> out = clients_[r]->Length(sequence_id);
  if (!out.ok()) return Named(r, out.status());
  return out;
}

std::vector<absl::StatusOr<v1::InfoResponse>> ShardedClient::InfoAll() {
  std::vector<absl::StatusOr<v1::InfoResponse>> out(replicas_.size(), v1::InfoResponse());
  std::vector<int> all;
  for (int r = 0; r < replica_count(); ++r) all.push_back(r);
  ForEachConcurrently(all, [&](int r) {
    out[r] = clients_[r]->Info();
    if (!out[r].ok()) out[r] = Named(r, out[r].status());
  });
  return out;
}

std::vector<absl::StatusOr<v1::StatsResponse>> ShardedClient::StatsAll() {
  std::vector<absl::StatusOr<v1::StatsResponse>> out(replicas_.size(), v1::StatsResponse());
  std::vector<int> all;
  for (int r = 0; r < replica_count(); ++r) all.push_back(r);
  ForEachConcurrently(all, [&](int r) {
    out[r] = clients_[r]->Stats();
    if (!out[r].ok()) out[r] = Named(r, out[r].status());
  });
  return out;
}

std::vector<absl::StatusOr<v1::LookupResponse>> ShardedClient::LookupAll(const v1::LookupRequest& request) {
  std::vector<absl::StatusOr<v1::LookupResponse>> out(replicas_.size(), v1::LookupResponse());
  std::vector<int> all;
  for (int r = 0; r < replica_count(); ++r) all.push_back(r);
  ForEachConcurrently(all, [&](int r) {
    out[r] = clients_[r]->Lookup(request);
    if (!out[r].ok()) out[r] = Named(r, out[r].status());
  });
  return out;
}

int ShardedClient::LongestPrefix(const std::vector<absl::StatusOr<v1::LookupResponse>>& answers) {
  int best = -1;
  uint64_t most = 0;
  for (size_t r = 0; r < answers.size(); ++r) {
    if (answers[r].ok() && answers[r]->tokens() > most) {
      best = static_cast<int>(r);
      most = answers[r]->tokens();
    }
  }
  return best;
}

std::string ShardedClient::SequenceIdOn(absl::string_view base, int replica) const {
  // With N replicas each candidate is the replica's with probability 1/N:
  // the expected tries are N, and 64 N fail with probability < e^-64.
  for (uint64_t k = 0;; ++k) {
    std::string id = k == 0 ? std::string(base) : absl::StrCat(base, "~", k);
    if (ReplicaOf(id) == replica || k >= 64 * replicas_.size()) return id;
  }
}

absl::StatusOr<ShardedClient::PrefixFork> ShardedClient::ForkFromPrefix(absl::Span<const uint32_t> token_ids,
                                                                        absl::string_view base, uint64_t max_tokens) {
  if (replicas_.empty()) return absl::FailedPreconditionError("ShardedClient has no replicas");
  v1::LookupRequest request;
  request.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  const std::vector<absl::StatusOr<v1::LookupResponse>> answers = LookupAll(request);
  const int best = LongestPrefix(answers);
  if (best < 0) {
    std::string why;
    for (int r = 0; r < replica_count(); ++r) {
      absl::StrAppend(&why, r == 0 ? "" : "; ", replicas_[r], ": ",
                      answers[r].ok() ? answers[r]->miss_message() : answers[r].status().ToString());
    }
    return absl::NotFoundError(absl::StrCat("no replica holds a page of the prompt (", why, ")"));
  }
  PrefixFork out;
  out.replica = best;
  out.sequence_id = SequenceIdOn(base, best);
  if (ReplicaOf(out.sequence_id) != best) {
    return absl::InternalError(absl::StrCat("no id from \"", base, "\" routes to replica ", replicas_[best]));
  }
  absl::StatusOr<v1::ForkResponse> fork = clients_[best]->ForkFromPrefix(token_ids, out.sequence_id, max_tokens);
  if (!fork.ok()) return Named(best, fork.status());
  out.response = *std::move(fork);
  return out;
}

}  // namespace driftkv
