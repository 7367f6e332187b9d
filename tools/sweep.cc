#include "tools/sweep.h"

#include <cstdio>

namespace driftkv {

int RunSweep(int, char**) {
  std::fprintf(stderr, "driftkv-codec sweep: not built into this binary yet\n");
  return 2;
}

}  // namespace driftkv
