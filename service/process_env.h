// What a process that serves sets before anything touches a device or
// takes a lock: driftkv-server, and the benchmarks that run its servers in
// their own process, so that they measure what the server does.
#ifndef DRIFTKV_SERVICE_PROCESS_ENV_H_
#define DRIFTKV_SERVICE_PROCESS_ENV_H_

namespace driftkv {

// Call first in main(), before any CUDA call.
//
// CUDA loads a kernel's module at the kernel's first launch unless told
// otherwise, so the first request to use a kernel (a sequence's first
// Attend: the promotion, checksum and attention kernels) would pay for
// loading it: ~0.5 ms on the H200 (docs/hot_tier.md, "The first Attend").
// A server loads every module when its CUDA context is made instead
// (CUDA_MODULE_LOADING=EAGER), unless the environment already chose.
//
// Debian's Abseil is built with Mutex deadlock detection on. It records an
// edge from every lock a thread holds to each lock it takes, and searches
// the graph for a cycle whenever an edge is new: a 64-item Attend holds 128
// locks, so its first call pays for thousands of searches and every later
// call for as many lookups. The server turns it off; the TSan suite checks
// lock order instead. A caller that wants it (driftkv-server
// --mutex_deadlock_detection) turns it back on afterwards.
void PrepareServerProcess();

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PROCESS_ENV_H_
