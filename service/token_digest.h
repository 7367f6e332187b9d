// The digest of one stored token, kept host-side for every token encoded
// into a page (LayerState::digests), so that a repeated Append of tokens
// already in pages can be compared with what was received without decoding
// the lossy pages. It covers the token's bf16 keys then bf16 values (the
// form the window holds and pages are encoded from), so it does not depend
// on how the tokens were chunked or which dtype carried them. 64 bits: two
// different tokens share a digest with probability about 2^-64. Stable
// across processes and builds (a snapshot may carry it).
#ifndef DRIFTKV_SERVICE_TOKEN_DIGEST_H_
#define DRIFTKV_SERVICE_TOKEN_DIGEST_H_

#include <cstddef>
#include <cstdint>

namespace driftkv {

// A digest that stands for "not recorded": tokens with it are not compared
// (a real token digests to it with probability 2^-64).
constexpr uint64_t kNoDigest = 0;

// keys, values: n bf16 values each.
uint64_t TokenDigest(const uint16_t* keys, const uint16_t* values, size_t n);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TOKEN_DIGEST_H_
