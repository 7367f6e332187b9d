#include "service/page_key.h"

#include <openssl/sha.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace driftkv {
namespace {

// Pages of up to this many tokens are hashed without allocating.
constexpr size_t kStackIds = 1024;

PageKey Truncate(const unsigned char (&digest)[SHA256_DIGEST_LENGTH]) {
  static_assert(PageKey::kBytes <= SHA256_DIGEST_LENGTH, "a key is a prefix of the digest");
  PageKey k;
  std::memcpy(k.bytes.data(), digest, PageKey::kBytes);
  return k;
}

PageKey TaggedKey(absl::string_view tag, absl::string_view codec_identity, absl::string_view name) {
  std::string m = absl::StrCat(tag, absl::string_view("\0", 1), codec_identity, absl::string_view("\0", 1), name);
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(m.data()), m.size(), d);
  return Truncate(d);
}

}  // namespace

bool PageKey::FromBytes(absl::string_view b, PageKey* out) {
  if (b.size() != kBytes) return false;
  std::memcpy(out->bytes.data(), b.data(), kBytes);
  return true;
}

std::string PageKey::Hex() const {
  return absl::BytesToHexString(view());
}

const PageKey& PageKeyRoot() {
  static const PageKey root = [] {
    constexpr absl::string_view kRoot = "driftkv page key v1";
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(kRoot.data()), kRoot.size(), d);
    return Truncate(d);
  }();
  return root;
}

PageKey NextPageKey(const PageKey& parent, absl::Span<const uint32_t> page_ids) {
  // One-shot SHA256 (OpenSSL 3 deprecates the incremental SHA256_* calls)
  // over parent || ids, in a stack buffer for pages of up to kStackIds.
  unsigned char stack[PageKey::kBytes + 4 * kStackIds];
  std::vector<unsigned char> heap;
  unsigned char* buf = stack;
  const size_t bytes = PageKey::kBytes + 4 * page_ids.size();
  if (page_ids.size() > kStackIds) {
    heap.resize(bytes);
    buf = heap.data();
  }
  std::memcpy(buf, parent.bytes.data(), PageKey::kBytes);
  unsigned char* le = buf + PageKey::kBytes;
  for (size_t i = 0; i < page_ids.size(); ++i) {
    const uint32_t v = page_ids[i];
    le[4 * i] = static_cast<unsigned char>(v);
    le[4 * i + 1] = static_cast<unsigned char>(v >> 8);
    le[4 * i + 2] = static_cast<unsigned char>(v >> 16);
    le[4 * i + 3] = static_cast<unsigned char>(v >> 24);
  }
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(buf, bytes, d);
  return Truncate(d);
}

void ChainPageKeys(absl::Span<const uint32_t> ids, int page_tokens, std::vector<PageKey>* out) {
  const size_t p = static_cast<size_t>(page_tokens);
  PageKey parent = PageKeyRoot();
  for (size_t at = 0; at + p <= ids.size(); at += p) {
    parent = NextPageKey(parent, ids.subspan(at, p));
    out->push_back(parent);
  }
}

PageKey NamespaceKey(absl::string_view codec_identity, absl::string_view tenant) {
  return TaggedKey("driftkv namespace v1", codec_identity, tenant);
}

PageKey SharedNamespaceKey(absl::string_view codec_identity, absl::string_view name) {
  return TaggedKey("driftkv shared namespace v1", codec_identity, name);
}

}  // namespace driftkv
