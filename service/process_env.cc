#include "service/process_env.h"

#include <cstdlib>

namespace driftkv {

void PrepareServerProcess() {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
}

}  // namespace driftkv
