// Handler::Lookup: the longest prefix of a prompt that the prefix index
// holds for the caller's tenant (service/prefix_index.h), and the prompt
// keys Lookup and Fork from a prefix share.
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"
#include "service/quoted.h"

namespace driftkv {

// Metrics::RecordLookup's outcome labels follow PrefixIndex::Miss.
static_assert(static_cast<int>(PrefixIndex::Miss::kOtherNamespace) == 5, "Metrics::LookupOutcomeName");

absl::Status Handler::PromptKeys(absl::string_view ids_field, absl::Span<const uint32_t> ids,
                                 absl::string_view keys_field,
                                 const google::protobuf::RepeatedPtrField<std::string>& keys,
                                 std::vector<PageKey>* out) const {
  out->clear();
  if (!ids.empty() && !keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids_field, " and ", keys_field, " are both set; send one or the other"));
  }
  if (ids.empty() && keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids_field, " and ", keys_field, " are both empty; send the prompt's token ids or its page keys"));
  }
  if (!ids.empty()) {
    out->reserve(ids.size() / pool_->page_tokens());
    ChainPageKeys(ids, pool_->page_tokens(), out);
    return absl::OkStatus();
  }
  out->resize(keys.size());
  for (int i = 0; i < keys.size(); ++i) {
    if (!PageKey::FromBytes(keys[i], &(*out)[i])) {
      out->clear();
      return absl::InvalidArgumentError(
          absl::StrCat(keys_field, "[", i, "] has ", keys[i].size(), " bytes; a page key has ", PageKey::kBytes));
    }
  }
  return absl::OkStatus();
}

const std::string* Handler::SharedNamespaceName(const std::string& tenant) const {
  const auto shared = options_.prefix_namespace_of.find(tenant);
  return shared != options_.prefix_namespace_of.end() ? &shared->second : nullptr;
}

PageKey Handler::NamespaceOf(const std::string& tenant) const {
  const std::string* shared = SharedNamespaceName(tenant);
  return shared != nullptr ? SharedNamespaceKey(codec_identity_, *shared) : NamespaceKey(codec_identity_, tenant);
}

absl::Status Handler::PrefixPages(uint64_t tokens, absl::Span<const uint32_t> ids,
                                  const google::protobuf::RepeatedPtrField<std::string>& page_keys,
                                  absl::string_view bound, absl::string_view whole, std::vector<PageKey>* keys,
                                  int64_t* most) const {
  const int64_t p = pool_->page_tokens();
  if (tokens % p != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens ", tokens, " is not a multiple of page_tokens ", p, "; ", bound, " (0: no bound)"));
  }
  absl::Status st = PromptKeys("prefix_token_ids", ids, "prefix_page_keys", page_keys, keys);
  if (!st.ok()) return st;
  if (keys->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix_token_ids has ", ids.size(), " ids, fewer than page_tokens ", p, ": ", whole));
  }
  *most = tokens == 0 ? static_cast<int64_t>(keys->size()) : static_cast<int64_t>(tokens) / p;
  return absl::OkStatus();
}

std::string Handler::MissMessage(const PrefixIndex::Match& m, const std::string& tenant) const {
  const int64_t p = pool_->page_tokens();
  const std::string page =
      absl::StrCat("page ", m.pages, " (tokens [", m.pages * p, ", ", (m.pages + 1) * p, ")) of layer ", m.miss_layer);
  switch (m.miss) {
    case PrefixIndex::Miss::kNone: return "every page is held";
    case PrefixIndex::Miss::kEvicted: return absl::StrCat(page, " was evicted to make room");
    case PrefixIndex::Miss::kUnhashed:
      return absl::StrCat(page,
                          " is not indexed: a sequence holding the pages before it went on with tokens "
                          "appended without token_ids");
    case PrefixIndex::Miss::kDiverged:
      return absl::StrCat(page,
                          " is not held, but another page following the same prefix was stored: the prompt "
                          "diverges from a stored one inside this page (other token ids, or hashed otherwise)");
    case PrefixIndex::Miss::kNeverStored:
    case PrefixIndex::Miss::kOtherNamespace: break;  // the same words: tenants see nothing of each other
  }
  if (const std::string* shared = SharedNamespaceName(tenant); shared != nullptr) {
    return absl::StrCat(page, " was never stored with token_ids by the tenants of prefix namespace ", Quoted(*shared),
                        " under this codec");
  }
  return absl::StrCat(page, " was never stored with token_ids by this tenant under this codec");
}

absl::Status Handler::Lookup(const v1::LookupRequest& request, v1::LookupResponse* response,
                             const std::string& tenant) const {
  thread_local std::vector<PageKey> keys;  // no allocation per call once grown
  absl::Status st = PromptKeys("token_ids", request.token_ids(), "page_keys", request.page_keys(), &keys);
  if (!st.ok()) return st;
  PrefixIndex::Match m;
  index_->Lookup(NamespaceOf(tenant), keys, &m);
  response->Clear();
  response->set_prompt_pages(keys.size());
  response->set_pages(static_cast<uint64_t>(m.pages));
  response->set_tokens(static_cast<uint64_t>(m.pages * pool_->page_tokens()));
  for (int64_t n : m.layer_pages) response->add_layer_pages(static_cast<uint64_t>(n));
  metrics_->RecordLookup(tenant, static_cast<int>(m.miss), static_cast<uint64_t>(m.pages),
                         keys.size() - static_cast<uint64_t>(m.pages));
  switch (m.miss) {
    case PrefixIndex::Miss::kNone: response->set_miss_reason(v1::MISS_NONE); return absl::OkStatus();
    case PrefixIndex::Miss::kNeverStored:
    case PrefixIndex::Miss::kOtherNamespace: response->set_miss_reason(v1::MISS_NEVER_STORED); break;
    case PrefixIndex::Miss::kDiverged: response->set_miss_reason(v1::MISS_DIVERGED); break;
    case PrefixIndex::Miss::kEvicted: response->set_miss_reason(v1::MISS_EVICTED); break;
    case PrefixIndex::Miss::kUnhashed: response->set_miss_reason(v1::MISS_UNHASHED); break;
  }
  response->set_miss_page(static_cast<uint64_t>(m.pages));
  response->set_miss_layer(static_cast<uint32_t>(m.miss_layer));
  response->set_miss_message(MissMessage(m, tenant));
  return absl::OkStatus();
}

}  // namespace driftkv
