// Doorbells (wire/doorbell.h): Attend requests through a slot in a host
// region, answered by a server thread that watches the slot, for clients on
// the server's host that want no socket between them and the kernel.
//
// A doorbell belongs to the tenant that opened it (OpenDoorbell) and acts
// for it: every request is an ordinary Handler::Attend of that tenant, with
// the same checks and quotas. It holds its region mapped while it runs and
// stops when closed, when its region leaves the region table (unregistered
// or its lease ran out: a client that dies leaks nothing), or at drain.
// While requests arrive, its thread spins (kSpinTime after each answer);
// then it sleeps on the futex until a client wakes it.
//
// LIMITS: kMaxDoorbellsPerTenant per tenant, kMaxDoorbells in all.
#ifndef DRIFTKV_SERVICE_DOORBELL_H_
#define DRIFTKV_SERVICE_DOORBELL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/driftkv.pb.h"
#include "service/attend_reuse.h"
#include "service/regions.h"

namespace driftkv {

constexpr int kMaxDoorbellsPerTenant = 16;
constexpr int kMaxDoorbells = 256;
constexpr absl::Duration kSpinTime = absl::Microseconds(200);

using AttendFn = std::function<absl::Status(const v1::AttendRequest&, v1::AttendResponse*, const std::string&)>;
// The same with what a prepared request keeps between its calls
// (service/attend_reuse.h).
using ReusingAttendFn =
    std::function<absl::Status(const v1::AttendRequest&, v1::AttendResponse*, const std::string&, AttendReuse*)>;

// Serves the request in the doorbell at `base` whose request_seq is `seq`
// (the memory as wire/doorbell.h lays it out, `request_capacity` and
// `response_capacity` bytes of areas): by its kind, copies and parses the
// request and answers it through `attend` for `tenant` unless its deadline
// passed, keeps it as a prepared request, or answers a prepared one; then
// writes the answer (response_seq last). `scratch` is reused between calls.
// Never reads or writes outside [base, base + Bytes(capacities)), whatever
// the memory holds. Exposed for tests and the fuzz target.
//
// A doorbell's requests look alike call after call (the same items, other
// layers and offsets): parsing into the same messages every time reuses
// their strings and sub-messages instead of allocating them again. The
// scratch also keeps the doorbell's prepared requests (wire/doorbell.h,
// PREPARED REQUESTS).
struct DoorbellScratch {
  std::string bytes;  // the request, copied out of the shared memory
  v1::AttendRequest request;
  v1::AttendResponse response;
  struct Prepared {
    v1::AttendRequest request;
    // (item, new_token_index as prepared) of the items that set one.
    std::vector<std::pair<int, uint64_t>> indexed;
    uint64_t bytes = 0;  // serialized size, counted against kMaxPreparedBytes
    AttendReuse reuse;   // what `reusing` keeps between the slot's calls
  };
  std::vector<std::unique_ptr<Prepared>> prepared;  // by slot; null: empty
  uint64_t prepared_bytes = 0;
};
// `reusing` (may be null) answers prepared requests instead of `attend`.
void ServeDoorbellRequest(uint8_t* base, uint64_t request_capacity, uint64_t response_capacity, uint64_t seq,
                          const AttendFn& attend, const std::string& tenant, DoorbellScratch* scratch,
                          const ReusingAttendFn* reusing = nullptr);

class DoorbellTable {
 public:
  // `regions` must outlive the table. `reusing` (may be empty) answers
  // prepared requests.
  DoorbellTable(RegionTable* regions, AttendFn attend, ReusingAttendFn reusing = nullptr);
  ~DoorbellTable();  // CloseAll

  absl::Status Open(const v1::OpenDoorbellRequest& request, v1::OpenDoorbellResponse* response,
                    const std::string& tenant);
  absl::Status Close(const v1::CloseDoorbellRequest& request, const std::string& tenant);
  // Stops every doorbell and refuses new ones (drain, shutdown).
  void CloseAll();
  // Drops doorbells whose thread stopped because their region went (so its
  // memory is unmapped); the server's reaper calls it. Returns how many.
  int Sweep();
  int open() const;

 private:
  class Bell;
  RegionTable* const regions_;
  const AttendFn attend_;
  const ReusingAttendFn reusing_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Bell>> bells_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_DOORBELL_H_
