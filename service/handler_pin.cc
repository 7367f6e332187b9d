// Handler::Pin and Handler::Unpin: prefixes of the prefix index kept
// resident for a lease (service/pin_table.h, docs/prefix_cache.md "Pins").
// The pages are taken from the index exactly as Fork from a prefix takes
// them (PrefixIndex::Take, under the index's lock, so no eviction frees
// one meanwhile), then handed to the pin table, which charges the tenant.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"

namespace driftkv {

using handler_internal::Quoted;

absl::Status Handler::Pin(const v1::PinRequest& request, v1::PinResponse* response, const std::string& tenant) {
  const std::string& id = request.pin_id();
  const int64_t p = pool_->page_tokens();
  absl::Status st = CheckSequenceId("pin_id", id);
  if (st.ok() && !(request.ttl_seconds() > 0.0 && request.ttl_seconds() <= kMaxPinSeconds)) {
    st = absl::InvalidArgumentError(absl::StrCat("ttl_seconds ", request.ttl_seconds(), " is outside (0, ",
                                                 kMaxPinSeconds, "]; a pin needs a lease (repeat the Pin to renew)"));
  }
  std::vector<PageKey> keys;
  int64_t most = 0;
  if (st.ok()) {
    st = PrefixPages(request.tokens(), request.prefix_token_ids(), request.prefix_page_keys(),
                     "it bounds the whole pages pinned", "a pin holds whole pages", &keys, &most);
  }
  if (!st.ok()) return st;

  PrefixIndex::Taken taken;
  PrefixIndex::Match match;
  const int64_t pages = index_->Take(NamespaceOf(tenant), keys, most, &taken, &match);
  if (pages == 0) {
    // Another tenant's prefix reads as never stored: the same words.
    return absl::NotFoundError(
        absl::StrCat("no stored prefix of the prompt for pin_id ", Quoted(id), ": ", MissMessage(match, tenant)));
  }
  std::vector<PageId> all;
  all.reserve(pages * options_.layers);
  for (const std::vector<PageId>& layer : taken.pages) all.insert(all.end(), layer.begin(), layer.end());
  const absl::Time now = clock_();
  const absl::Time expires = now + absl::Seconds(request.ttl_seconds());
  PinTable::Placed placed;
  st = pins_->Put(TenantKey(tenant, id), id, table_->Usage(tenant), std::move(all),
                  static_cast<int64_t>(pool_->page_stride()), now, expires, &placed);
  PublishGauges();
  if (!st.ok()) return st;
  response->Clear();
  response->set_tokens(static_cast<uint64_t>(pages * p));
  response->set_pages_pinned(static_cast<uint64_t>(pages * options_.layers));
  response->set_expire_unix_ms(absl::ToUnixMillis(expires));
  response->set_replaced(placed.replaced);
  return absl::OkStatus();
}

absl::Status Handler::Unpin(const v1::UnpinRequest& request, v1::UnpinResponse* response, const std::string& tenant) {
  absl::Status st = CheckSequenceId("pin_id", request.pin_id());
  if (!st.ok()) return st;
  absl::StatusOr<int64_t> pages = pins_->Remove(TenantKey(tenant, request.pin_id()), request.pin_id(), clock_());
  if (!pages.ok()) return pages.status();
  PublishGauges();
  response->Clear();
  response->set_pages_unpinned(static_cast<uint64_t>(*pages));
  return absl::OkStatus();
}

}  // namespace driftkv
