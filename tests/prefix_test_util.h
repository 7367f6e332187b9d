// Helpers of the prefix-cache tests through the handler: prompts of token
// ids and Lookup by them.
#ifndef DRIFTKV_TESTS_PREFIX_TEST_UTIL_H_
#define DRIFTKV_TESTS_PREFIX_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/handler.h"

namespace driftkv {
namespace testing {

// `count` token ids below 50,000 drawn from `seed`.
inline std::vector<uint32_t> PromptIds(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> ids(count);
  for (uint32_t& id : ids) id = rng() % 50000;
  return ids;
}

// Lookup of the prompt `ids` as `tenant`; a failed call is a test failure.
inline v1::LookupResponse LookupIds(Handler& h, const std::vector<uint32_t>& ids, const std::string& tenant = "") {
  v1::LookupRequest req;
  for (uint32_t id : ids) req.add_token_ids(id);
  v1::LookupResponse resp;
  absl::Status st = h.Lookup(req, &resp, tenant);
  EXPECT_TRUE(st.ok()) << st;
  return resp;
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_PREFIX_TEST_UTIL_H_
