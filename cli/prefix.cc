// The prefix-cache commands of the `driftkv` CLI (docs/prefix_cache.md):
// lookup, pin, unpin and watch, and the token ids they (and push) read
// from --token_ids or --token_ids_file.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/cli.h"

ABSL_FLAG(std::string, token_ids, "", "push/lookup/pin/fork: the prompt's token ids, comma-separated");
ABSL_FLAG(std::string, token_ids_file, "",
          "push/lookup/pin: a file of the prompt's token ids (decimal, separated by commas or whitespace)");
ABSL_FLAG(std::string, pin_id, "", "pin/unpin: the pin's name in the caller's tenant");
ABSL_FLAG(double, ttl_s, 3600, "pin: the lease in seconds, at most 604800 (a week); pin again to renew");
ABSL_FLAG(uint64_t, max_tokens, 0,
          "pin, fork: at most these tokens per layer, a multiple of page_tokens (0: all held)");
ABSL_FLAG(std::string, from, "", "fork: the source sequence (empty: fork from the prefix index by token ids)");
ABSL_FLAG(uint64_t, fork_tokens, 0, "fork --from: the tokens to share, a multiple of page_tokens");
ABSL_FLAG(uint32_t, max_batch, 0, "watch: events per message, at most 4096 (0: the server's 256)");
ABSL_FLAG(uint32_t, buffer_events, 0,
          "watch: events the server buffers for this watch before it drops them, at most 1048576 (0: 65536)");

namespace driftkv {
namespace cli {
namespace {

// Set by SIGINT and SIGTERM during `watch`; a thread of Watch() cancels
// the call when it sees it (TryCancel is not async-signal-safe).
volatile std::sig_atomic_t interrupted = 0;

extern "C" void OnInterrupt(int) {
  interrupted = 1;
}

// "MISS_NEVER_STORED" -> "never_stored", the Python client's words.
std::string MissName(v1::MissReason reason) {
  std::string name = v1::MissReason_Name(reason);
  if (absl::StartsWith(name, "MISS_")) name = name.substr(5);
  return absl::AsciiStrToLower(name);
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> TokenIdsFromFlags(bool required) {
  const std::string list = absl::GetFlag(FLAGS_token_ids), path = absl::GetFlag(FLAGS_token_ids_file);
  if (!list.empty() && !path.empty()) {
    return absl::InvalidArgumentError("--token_ids and --token_ids_file are both set; give one");
  }
  if (list.empty() && path.empty()) {
    if (!required) return std::vector<uint32_t>();
    return absl::InvalidArgumentError("give the prompt's token ids: --token_ids 1,2,3 or --token_ids_file F");
  }
  std::string text = list;
  std::string where = "--token_ids";
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open --token_ids_file ", path));
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
    where = absl::StrCat("--token_ids_file ", path);
  }
  std::vector<uint32_t> ids;
  for (absl::string_view item : absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    uint32_t id;
    if (!absl::SimpleAtoi(item, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": item ", ids.size(), " \"", absl::CEscape(item),
                                                     "\" is not a token id (a decimal in [0, 4294967295])"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " holds no token id"));
  return ids;
}

int Lookup(Client& client, const v1::InfoResponse& info) {
  absl::StatusOr<std::vector<uint32_t>> ids = TokenIdsFromFlags(true);
  if (!ids.ok()) return Fail(ids.status());
  absl::StatusOr<v1::LookupResponse> r = client.Lookup(*ids);
  if (!r.ok()) return Fail(r.status());
  const uint64_t page_tokens = info.page_tokens();
  std::printf("prompt: %zu tokens, %llu full pages; held in every layer: %llu pages (%llu tokens)\n", ids->size(),
              static_cast<unsigned long long>(r->prompt_pages()), static_cast<unsigned long long>(r->pages()),
              static_cast<unsigned long long>(r->tokens()));
  for (int l = 0; l < r->layer_pages_size(); ++l) {
    std::printf("layer %d: %llu pages (%llu tokens)\n", l, static_cast<unsigned long long>(r->layer_pages(l)),
                static_cast<unsigned long long>(r->layer_pages(l) * page_tokens));
  }
  if (r->miss_reason() == v1::MISS_NONE) {
    std::printf("miss: none\n");
  } else {
    std::printf("miss: page %llu of layer %u: %s: %s\n", static_cast<unsigned long long>(r->miss_page()),
                r->miss_layer(), MissName(r->miss_reason()).c_str(), r->miss_message().c_str());
  }
  return 0;
}

int Pin(Client& client) {
  absl::StatusOr<std::vector<uint32_t>> ids = TokenIdsFromFlags(true);
  if (!ids.ok()) return Fail(ids.status());
  const std::string id = absl::GetFlag(FLAGS_pin_id);
  absl::StatusOr<v1::PinResponse> r = client.Pin(id, *ids, absl::GetFlag(FLAGS_ttl_s), absl::GetFlag(FLAGS_max_tokens));
  if (!r.ok()) return Fail(r.status());
  const absl::Time until = absl::FromUnixMillis(r->expire_unix_ms());
  std::printf("pinned %s: %llu tokens per layer, %llu pages, until %s%s\n", id.c_str(),
              static_cast<unsigned long long>(r->tokens()), static_cast<unsigned long long>(r->pages_pinned()),
              absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", until, absl::UTCTimeZone()).c_str(),
              r->replaced() ? " (replaced the live pin of that id)" : "");
  return 0;
}

int Fork(Client& client, const std::string& sequence_id) {
  const std::string from = absl::GetFlag(FLAGS_from);
  absl::StatusOr<v1::ForkResponse> r;
  if (!from.empty()) {
    r = client.Fork(from, sequence_id, absl::GetFlag(FLAGS_fork_tokens));
  } else {
    absl::StatusOr<std::vector<uint32_t>> ids = TokenIdsFromFlags(true);
    if (!ids.ok()) return Fail(ids.status());
    r = client.ForkFromPrefix(*ids, sequence_id, absl::GetFlag(FLAGS_max_tokens));
  }
  if (!r.ok()) return Fail(r.status());
  std::printf("forked %s from %s: %llu tokens per layer, %llu pages shared; append from token %llu\n",
              sequence_id.c_str(), from.empty() ? "the prefix index" : from.c_str(),
              static_cast<unsigned long long>(r->tokens()), static_cast<unsigned long long>(r->pages_shared()),
              static_cast<unsigned long long>(r->tokens()));
  return 0;
}

int Unpin(Client& client) {
  const std::string id = absl::GetFlag(FLAGS_pin_id);
  absl::StatusOr<v1::UnpinResponse> r = client.Unpin(id);
  if (!r.ok()) return Fail(r.status());
  std::printf("unpinned %s: %llu pages\n", id.c_str(), static_cast<unsigned long long>(r->pages_unpinned()));
  return 0;
}

int Watch(Client& client) {
  v1::WatchPagesRequest request;
  request.set_max_batch(absl::GetFlag(FLAGS_max_batch));
  request.set_buffer_events(absl::GetFlag(FLAGS_buffer_events));
  const uint64_t most = absl::GetFlag(FLAGS_count);
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);
  // No deadline: the stream lasts until --count events or a signal.
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::PageEventBatch>> reader = client.stub()->WatchPages(&context, request);
  std::atomic<bool> done{false};
  std::thread canceller([&] {
    while (!done.load() && interrupted == 0) absl::SleepFor(absl::Milliseconds(50));
    if (interrupted != 0) context.TryCancel();
  });
  uint64_t events = 0, dropped = 0;
  bool enough = false;
  v1::PageEventBatch batch;
  while (!enough && reader->Read(&batch)) {
    if (batch.dropped() > 0) {
      std::printf("dropped %llu\n", static_cast<unsigned long long>(batch.dropped()));
      dropped += batch.dropped();
    }
    for (const v1::PageEvent& e : batch.events()) {
      std::printf("%s %s layer %u\n", e.kind() == v1::PAGE_STORED ? "stored" : "evicted",
                  absl::BytesToHexString(e.page_key()).c_str(), e.layer());
      if (++events == most) {
        enough = true;
        break;
      }
    }
    std::fflush(stdout);  // a line per event as it comes, also into a pipe
  }
  if (enough) context.TryCancel();
  const grpc::Status st = reader->Finish();
  done = true;
  canceller.join();
  std::fprintf(stderr, "watch: %llu events, %llu dropped\n", static_cast<unsigned long long>(events),
               static_cast<unsigned long long>(dropped));
  // CANCELLED is the end this process asked for.
  if (!st.ok() && !((enough || interrupted != 0) && st.error_code() == grpc::StatusCode::CANCELLED)) {
    return Fail(FromGrpc(st));
  }
  return 0;
}

}  // namespace cli
}  // namespace driftkv
