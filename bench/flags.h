// The benches' flags: --name=value on the command line (the first of a
// name counts), a default when absent.
#ifndef DRIFTKV_BENCH_FLAGS_H_
#define DRIFTKV_BENCH_FLAGS_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace driftkv {
namespace bench {

// The value of --name=value, or `def` when no argument sets it.
inline std::string Flag(int argc, char** argv, const char* name, const std::string& def) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], prefix)) return argv[i] + prefix.size();
  }
  return def;
}

// An integer flag; a value that is not one ends the bench, naming it (a
// typo must not run the default shape and print its figures).
inline int IntFlag(int argc, char** argv, const char* name, int def) {
  const std::string s = Flag(argc, argv, name, "");
  if (s.empty()) return def;
  int v = 0;
  if (!absl::SimpleAtoi(s, &v)) {
    std::fprintf(stderr, "--%s=%s is not an integer\n", name, s.c_str());
    std::exit(2);
  }
  return v;
}

}  // namespace bench
}  // namespace driftkv

#endif  // DRIFTKV_BENCH_FLAGS_H_
