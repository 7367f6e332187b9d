// A stand-in, on the CPU, for a backend that addresses client memory (the
// CUDA backend's contract, CLIENT MEMORY in backends/backend.h): the CPU
// backend registered as "host_addressing", reading queries at query_dev and
// writing outputs at out_dev/lse_dev in the wire dtypes, as the CUDA
// backend's gather and scatter do. It counts what it saw, across every
// instance (the registry makes them).
#ifndef DRIFTKV_TESTS_HOST_ADDRESSING_BACKEND_H_
#define DRIFTKV_TESTS_HOST_ADDRESSING_BACKEND_H_

#include <atomic>

namespace driftkv {
namespace testing {

extern std::atomic<int> g_pins, g_unpins, g_queries_read_in_place, g_outputs_written_in_place;
// True once registered (static initialisation of the test binary).
extern const bool kHostAddressingRegistered;

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_HOST_ADDRESSING_BACKEND_H_
