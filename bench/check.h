// Failure handling of the benchmark binaries: a benchmark that hits an
// error prints where and why and exits 1 rather than report a figure.
#ifndef DRIFTKV_BENCH_CHECK_H_
#define DRIFTKV_BENCH_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

#define CHECK_OK(x)                                                                              \
  do {                                                                                           \
    absl::Status s_ = (x);                                                                       \
    if (!s_.ok()) {                                                                              \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, std::string(s_.message()).c_str()); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

#endif  // DRIFTKV_BENCH_CHECK_H_
