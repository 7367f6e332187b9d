#include "service/tokens.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace driftkv {
namespace {

// The longest certificate name a line may bind (a DNS name is at most 253
// bytes; URIs such as SPIFFE ids may be longer).
constexpr size_t kMaxCertificateNameBytes = 1024;

}  // namespace

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, const std::string& path) {
  TokenTable t;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash_pos = line.find('#');
    if (hash_pos != absl::string_view::npos) line = line.substr(0, hash_pos);
    std::vector<absl::string_view> words = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    const std::string where = absl::StrCat("tokens_file ", path, " line ", line_no, ": ");
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       "expected SHA256HEX TENANT [max_pages=N] [max_sequences=N] [max_bytes=N] "
                       "[max_nccl_channels=N] [cert=NAME ...]"));
    }
    const std::string hash = absl::AsciiStrToLower(words[0]);
    if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "\"", words[0], "\" is not a SHA-256 in hex (64 digits); the file holds hashes, never tokens"));
    }
    const std::string tenant(words[1]);
    if (absl::Status st = CheckTenantName(tenant); !st.ok())
      return absl::InvalidArgumentError(where + std::string(st.message()));
    auto [entry, fresh] = t.grant_of_hash_.emplace(hash, TokenGrant{tenant, {}});
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the hash ", hash.substr(0, 12), "... is listed twice"));
    }
    Limits& limits = t.limits_[tenant];
    for (size_t i = 2; i < words.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
      if (kv.first == "cert") {
        if (kv.second.empty() || kv.second.size() > kMaxCertificateNameBytes) {
          return absl::InvalidArgumentError(absl::StrCat(where, "\"", words[i], "\": a certificate name is 1 to ",
                                                         kMaxCertificateNameBytes, " bytes"));
        }
        entry->second.certificates.emplace_back(kv.second);
        t.binds_certificates_ = true;
        continue;
      }
      uint64_t value = 0;
      std::optional<uint64_t>* slot = kv.first == "max_pages"           ? &limits.max_pages
                                      : kv.first == "max_sequences"     ? &limits.max_sequences
                                      : kv.first == "max_bytes"         ? &limits.max_bytes
                                      : kv.first == "max_nccl_channels" ? &limits.max_nccl_channels
                                                                        : nullptr;
      if (!absl::SimpleAtoi(kv.second, &value) || slot == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "\"", words[i],
                         "\" is not max_pages=N, max_sequences=N, max_bytes=N, max_nccl_channels=N or cert=NAME"));
      }
      if (slot->has_value() && **slot != value) {
        return absl::InvalidArgumentError(absl::StrCat(where, kv.first, " ", value, " of tenant \"", tenant,
                                                       "\" disagrees with ", **slot, " on an earlier line"));
      }
      *slot = value;
    }
  }
  return t;
}

absl::StatusOr<TokenTable> TokenTable::ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("tokens_file ", path, " cannot be opened"));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

const TokenGrant* TokenTable::Find(absl::string_view token) const {
  if (token.empty()) return nullptr;
  auto it = grant_of_hash_.find(Sha256Hex(token));
  return it == grant_of_hash_.end() ? nullptr : &it->second;
}

std::optional<std::string> TokenTable::TenantOf(absl::string_view token) const {
  const TokenGrant* grant = Find(token);
  if (grant == nullptr) return std::nullopt;
  return grant->tenant;
}

TenantQuota TokenTable::QuotaOf(const std::string& tenant, const TenantQuota& defaults) const {
  TenantQuota q = defaults;
  auto it = limits_.find(tenant);
  if (it != limits_.end()) {
    if (it->second.max_pages) q.max_pages = *it->second.max_pages;
    if (it->second.max_sequences) q.max_sequences = *it->second.max_sequences;
    if (it->second.max_bytes) q.max_bytes = *it->second.max_bytes;
    if (it->second.max_nccl_channels) q.max_nccl_channels = *it->second.max_nccl_channels;
  }
  return q;
}

std::vector<std::pair<std::string, TokenTable::Limits>> TokenTable::Tenants() const {
  std::vector<std::pair<std::string, Limits>> all(limits_.begin(), limits_.end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return all;
}

}  // namespace driftkv
