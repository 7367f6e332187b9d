// PAGE KEYS: a full page named by its content, so that a router can compute
// the name from token ids alone (docs/prefix_cache.md, "Page keys").
//
// With P = page_tokens and a sequence's token ids t_0, t_1, ... (uint32):
//   ROOT  = SHA-256("driftkv page key v1")[0, 16)       (the 19 ASCII bytes)
//   K_0   = SHA-256(ROOT || le32(t_0) || ... || le32(t_{P-1}))[0, 16)
//   K_k   = SHA-256(K_{k-1} || le32(t_{kP}) || ... || le32(t_{kP+P-1}))[0, 16)
// i.e. the first 16 bytes of the digest of the parent's 16-byte key
// followed by the page's P ids as 4-byte little-endian integers. A key
// names the page and, through the chain, every token before it.
// 128 bits: a birthday collision needs ~2^64 pages, far beyond any index;
// 64 would be too few for a namespace shared by many prompts.
//
// The server qualifies a key with a namespace (never sent by a router):
//   NS(tenant) = SHA-256("driftkv namespace v1" || 0x00 || codec identity
//                        || 0x00 || tenant)[0, 16)
// where the codec identity is Handler::SnapshotIdentity() (codec, shape,
// page format, transform): tenants never share pages, and pages of another
// codec configuration never match. The index's entry is (NS, K_k, layer).
#ifndef DRIFTKV_SERVICE_PAGE_KEY_H_
#define DRIFTKV_SERVICE_PAGE_KEY_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace driftkv {

struct PageKey {
  static constexpr size_t kBytes = 16;
  std::array<uint8_t, kBytes> bytes{};

  bool operator==(const PageKey& o) const { return bytes == o.bytes; }
  bool operator!=(const PageKey& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const PageKey& k) {
    // Already uniformly distributed: the first 8 bytes are enough to mix.
    uint64_t w;
    std::memcpy(&w, k.bytes.data(), sizeof(w));
    return H::combine(std::move(h), w);
  }
  // From exactly kBytes bytes; false otherwise.
  static bool FromBytes(absl::string_view b, PageKey* out);
  absl::string_view view() const { return {reinterpret_cast<const char*>(bytes.data()), kBytes}; }
  std::string Hex() const;
};

// ROOT above: the parent of page 0.
const PageKey& PageKeyRoot();
// K_k from its parent's key and the page's P ids.
PageKey NextPageKey(const PageKey& parent, absl::Span<const uint32_t> page_ids);
// The keys of the full pages of `ids` (ids.size() / page_tokens of them),
// page 0 first, appended to *out.
void ChainPageKeys(absl::Span<const uint32_t> ids, int page_tokens, std::vector<PageKey>* out);
// NS above.
PageKey NamespaceKey(absl::string_view codec_identity, absl::string_view tenant);
// The namespace of the tenants of shared prefix namespace `name` (config
// prefix_namespaces): SHA-256("driftkv shared namespace v1" || 0x00 ||
// codec identity || 0x00 || name)[0:16], never a tenant's own NS.
PageKey SharedNamespaceKey(absl::string_view codec_identity, absl::string_view name);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PAGE_KEY_H_
