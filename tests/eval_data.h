// Where the C++ tests find the eval data (the shared fixture and model,
// docs/quality.md): $DRIFTKV_EVAL_DIR when set, else ../shared/eval
// relative to the repository root, the rule of python/examples/eval_data.py.
// No absolute path is built in.
//
// Under `bazel test` the working directory is the test's runfiles tree,
// whose files are links into the source tree: this header is carried as
// data (//tests:eval_data), so the real path of tests/eval_data.h names
// the repository root. Run by hand from the repository root, the same
// relative path resolves directly.
#ifndef DRIFTKV_TESTS_EVAL_DATA_H_
#define DRIFTKV_TESTS_EVAL_DATA_H_

#include <stdlib.h>

#include <cstdlib>
#include <string>

namespace driftkv::eval_data {

inline std::string Dir() {
  if (const char* env = std::getenv("DRIFTKV_EVAL_DIR"); env != nullptr && *env != '\0') return env;
  constexpr char kSelf[] = "/tests/eval_data.h";
  std::string root = ".";
  if (char* real = ::realpath("tests/eval_data.h", nullptr); real != nullptr) {
    const std::string path(real);
    ::free(real);
    root = path.substr(0, path.size() - (sizeof(kSelf) - 1));
  }
  return root + "/../shared/eval";
}

// The prefix of the fixture's files: Dir()/fixture_public (.k.bin,
// .v.bin, .q.bin, .json).
inline std::string FixturePrefix() {
  return Dir() + "/fixture_public";
}

}  // namespace driftkv::eval_data

#endif  // DRIFTKV_TESTS_EVAL_DATA_H_
