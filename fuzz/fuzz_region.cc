// libFuzzer: the memory regions' parsers and checks. The input drives
//   - the attach protocol (wire/fd_socket.h): CheckAttachRequest and
//     ParseAttachReply on the raw bytes; a parsed ok reply encodes back to
//     the same bytes;
//   - RegionTable (service/regions.h): two host regions of two tenants
//     (anonymous mappings, no backend), then a sequence of operations read
//     from the bytes: Resolve with arbitrary tenant, id, offset, byte count
//     and alignment, Unregister, Renew, a RegisterRegionRequest parsed from
//     the bytes, ExpireIdle on an advancing clock. Every view Resolve gives
//     is touched at its first and last byte (ASan: inside the mapping) and
//     must lie inside its region.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "service/regions.h"
#include "wire/fd_socket.h"

using namespace driftkv;

namespace {

struct Reader {
  const uint8_t* p;
  size_t n;
  uint64_t U64() {
    uint64_t v = 0;
    const size_t k = n < 8 ? n : 8;
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
  uint8_t U8() { return static_cast<uint8_t>(U64() & 0xff); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view raw(reinterpret_cast<const char*>(data), size);
  (void)CheckAttachRequest(raw);
  absl::StatusOr<AttachReply> reply = ParseAttachReply(raw);
  if (reply.ok() && reply->ok && EncodeAttachReply(*reply) != raw) __builtin_trap();

  ServiceOptions options;
  options.max_region_bytes = 1 << 16;
  options.max_regions = 3;
  absl::Time now = absl::FromUnixSeconds(1000);
  RegionTable table(options, nullptr, nullptr, [&now] { return now; });
  const std::string tenants[2] = {"a", "b"};
  uint64_t ids[2] = {0, 0};
  uint64_t sizes[2] = {4096, 12288};
  for (int t = 0; t < 2; ++t) {
    void* m = mmap(nullptr, sizes[t], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    absl::StatusOr<std::string> token = table.AddPending(m, sizes[t], {});
    if (!token.ok()) std::abort();
    v1::RegisterRegionRequest r;
    r.set_kind(v1::REGION_HOST_SHM);
    r.set_attach_token(*token);
    v1::RegisterRegionResponse out;
    if (!table.Register(r, &out, tenants[t]).ok()) std::abort();
    ids[t] = out.region_id();
  }

  Reader in{data, size};
  for (int step = 0; step < 64 && in.n > 0; ++step) {
    const uint8_t op = in.U8();
    const std::string& tenant = tenants[op & 1];
    switch ((op >> 1) % 5) {
      case 0: {  // Resolve
        v1::TensorRef ref;
        const uint8_t which = in.U8();
        ref.set_region_id(which < 200 ? ids[which & 1] : in.U64());
        ref.set_offset(in.U64() >> (in.U8() % 64));
        const uint64_t bytes = in.U64() >> (in.U8() % 64);
        const uint64_t alignment = uint64_t{1} << (in.U8() % 5);
        absl::StatusOr<RegionView> v = table.Resolve(tenant, ref, bytes, alignment, "items[0].query_ref");
        if (v.ok()) {
          const Region& r = *v->keep_alive;
          if (r.tenant() != tenant || ref.offset() + bytes > r.size() || ref.offset() % alignment != 0) {
            __builtin_trap();
          }
          if (bytes > 0) {
            static_cast<volatile char*>(v->data)[0] = 1;
            static_cast<volatile char*>(v->data)[bytes - 1] = 1;
          }
        }
        break;
      }
      case 1: {  // Unregister
        v1::UnregisterRegionRequest u;
        u.set_region_id(in.U8() < 200 ? ids[op >> 7] : in.U64());
        (void)table.Unregister(u, tenant);
        break;
      }
      case 2: {  // Renew
        v1::RenewRegionsRequest r;
        const int count = in.U8() % 4;
        for (int i = 0; i < count; ++i) r.add_region_ids(in.U8() < 128 ? ids[i & 1] : in.U64());
        v1::RenewRegionsResponse out;
        (void)table.Renew(r, &out, tenant);
        break;
      }
      case 3: {  // Register from arbitrary bytes (no backend: CUDA IPC is refused)
        const size_t len = in.U8() % 96;
        const size_t take = len < in.n ? len : in.n;
        v1::RegisterRegionRequest r;
        if (r.ParseFromArray(in.p, static_cast<int>(take))) {
          v1::RegisterRegionResponse out;
          (void)table.Register(r, &out, tenant);
        }
        in.p += take;
        in.n -= take;
        break;
      }
      case 4:  // time passes
        now += absl::Seconds(in.U8());
        table.ExpireIdle();
        break;
    }
  }
  return 0;
}
