// Where the tensors of an Attend item come from and where its answer goes:
// inline bytes of the request and response, or (region, offset)
// references into memory the client registered (service/regions.h).
//
// For each item, Prepare resolves and checks every tensor before any state
// changes (the handler's all-or-nothing rule):
//   query      inline bytes, or query_ref. On a backend that addresses
//              client memory (Backend::AddressesClientMemory, the CUDA
//              backend) a referenced query is read by the device where it
//              is; otherwise it must be host memory and is read like
//              inline bytes (in place when f32 and aligned).
//   new_key/   inline bytes, or new_key_ref/new_value_ref: always brought
//   new_value  to the host in bf16, the bf16 window's form (bf16 from the
//              wire is copied and checked as it is; other dtypes through
//              floats).
//   output,    inline in the AttendResult (output_dtype f32 or bf16), or
//   lse        written straight into output_ref/lse_ref (both or neither).
// On a backend that addresses client memory, inline queries and outputs
// pass through pinned host staging (service/pinned_staging.h) that the
// device reads and writes like a host region: the query is copied there in
// its wire dtype, the output comes back in the dtype asked for, and Finish
// copies it into the response.
// Queries are checked for non-finite values where it costs least. A call
// without a decode step changes no state, so its queries are checked by
// the backend as it reads them (AttendJob::check_query; CheckQuery turns
// what it found into the item's error): no pass of the handler's over the
// queries. A call with a decode step must refuse a bad query before its
// steps are applied: ReadClientTensors checks host queries on the CPU in
// their wire form, and the tensors the device reads in client memory in
// one backend call for the whole request.
// Bind points an AttendJob at the item's tensors; Finish moves what the
// backend left in host scratch to its destination.
//
// Every message names the item's field: "items[3].query_ref.region_id 7
// not found" (RegionTable's words), "items[3].output_ref and lse_ref: both
// or neither".
#ifndef DRIFTKV_SERVICE_ATTEND_IO_H_
#define DRIFTKV_SERVICE_ATTEND_IO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "proto/driftkv.pb.h"
#include "service/pinned_staging.h"
#include "service/regions.h"

namespace driftkv {

// The resolved tensors of one item.
struct ItemIo {
  // Query: host floats (`query`, owned by `converted` when converted), or
  // client memory the device reads (`query_dev` in query_dtype).
  const float* query = nullptr;
  std::vector<float> converted;
  const void* query_dev = nullptr;
  int query_dtype = v1::DTYPE_F32;
  // The query as the host can read it, for its check and its error
  // message: `query_host` in `query_host_dtype` (null: device memory only);
  // `query_by_ref`: it came by query_ref (the name messages use).
  const void* query_host = nullptr;
  int query_host_dtype = v1::DTYPE_F32;
  bool query_by_ref = false;
  // The decode step's token, bf16 [n] each (key/value: float scratch for
  // wire dtypes other than bf16 and for device reads).
  bool step = false;
  std::vector<uint16_t> key16, value16;
  std::vector<float> key, value;
  // Output: inline (response) or a region; host scratch when the backend
  // writes floats that must then be converted or copied.
  int out_dtype = v1::DTYPE_F32;
  void* out_ref = nullptr;  // region memory, or null: inline
  float* lse_ref = nullptr;
  bool out_ref_device = false;  // the backend writes out_ref/lse_ref itself
  bool out_staged = false;      // out_ref/lse_ref are pinned staging of an inline output
  std::vector<float> out_scratch, lse_scratch;
  // Indices into the request's ClientRead list (-1: none).
  int query_read = -1, key_read = -1, value_read = -1;

  // Every field back to its default but the vectors, which keep their
  // contents and capacity: storage reused call after call allocates and
  // zero-fills nothing when the calls are alike (every use of a vector
  // sizes it and writes it whole first).
  void Reset() {
    ItemIo fresh;
    fresh.converted.swap(converted);
    fresh.key.swap(key);
    fresh.value.swap(value);
    fresh.key16.swap(key16);
    fresh.value16.swap(value16);
    fresh.out_scratch.swap(out_scratch);
    fresh.lse_scratch.swap(lse_scratch);
    *this = std::move(fresh);
  }
};

// The inline outputs of an Attend left where the device wrote them, in the
// call's pinned staging, for an edge that sends them without a copy
// (service/attend_wire.h). The lease keeps the buffer out of the pool, and
// so the bytes unchanged, until its last holder lets it go.
struct StagedOutputs {
  std::shared_ptr<PinnedStagingPool::Lease> lease;
  // By result index: the output's bytes in the lease's buffer; empty (or
  // past the end) where the result's own output field holds them.
  std::vector<absl::string_view> outputs;
};

class AttendIo {
 public:
  // `regions` may be null (the server has none: every ref is NOT_FOUND);
  // `staging` may be null (inline tensors go through host floats).
  // `value_limit`: the largest |x| of a decode step's key or value.
  AttendIo(RegionTable* regions, PinnedStagingPool* staging, Backend* backend, const std::string& tenant, int head_dim,
           int n, float value_limit);

  // Before any Prepare: takes pinned staging for the request's inline
  // queries and outputs when the device reads client memory. Sizes come
  // from the unchecked request; a tensor that does not fit (or a request
  // the pool cannot serve) takes the host path, with the same answer.
  void StageInline(const v1::AttendRequest& request);
  // Before StageInline: the items' inline queries as the wire delivered
  // them (service/attend_request_wire.h), one per item, read instead of
  // the items' (empty) query fields. Must outlive the call.
  void UseWireQueries(absl::Span<const absl::string_view> queries) { wire_queries_ = queries; }

  // Resolves item `index`'s tensors into *io; `q_elements` = q_heads x
  // head_dim. No state changes.
  absl::Status Prepare(const v1::AttendItem& item, int index, size_t q_elements, ItemIo* io);
  // After every item's Prepare: with a decode step in the request, checks
  // the queries and reads and checks, in one backend call, the tensors
  // Prepare left in client memory (InvalidArgument naming the first
  // non-finite value); without one, leaves the queries to the backend.
  absl::Status ReadClientTensors();
  // Points `job` at the item's query and output; `result` is the item's
  // AttendResult (its inline output is sized here).
  void Bind(ItemIo* io, size_t q_elements, int q_heads, AttendJob* job, v1::AttendResult* result);
  // After the backend ran `job`: InvalidArgument naming the element if the
  // backend found the query non-finite (a call without decode steps leaves
  // its query checks to the backend; see ReadClientTensors).
  absl::Status CheckQuery(int index, const ItemIo& io, const AttendJob& job) const;
  // Before the first Finish: inline outputs in pinned staging stay there
  // and are named in *out (by item index) instead of being copied into
  // their results; HandOverStaging then gives *out the staging.
  void LeaveStagedOutputs(StagedOutputs* out) { leave_ = out; }
  // After the backend ran `job` of item `index`: inline lse and bf16
  // outputs, host-region copies.
  void Finish(ItemIo* io, int index, size_t q_elements, int q_heads, v1::AttendResult* result);
  // After the last Finish: the staging goes to LeaveStagedOutputs's *out
  // if an output was left there.
  void HandOverStaging();

  // Whether the request's items, as Prepare resolved them, are what an
  // AttendReuse may keep: no decode step, every query read and every
  // output written by the device where the client put it (no converted
  // or staged copy that a call fills).
  bool Keepable(absl::Span<const ItemIo* const> items) const;
  // Instead of Prepare, for items kept from an earlier call: looks up the
  // regions `ids` again for the tenant (held for this call, leases
  // extended); false if one is gone. Such a request has no decode step.
  bool AcquireAgain(absl::Span<const uint64_t> ids);
  // The regions Prepare resolved (each once).
  absl::Span<const std::shared_ptr<const Region>> regions() const { return seen_; }

 private:
  // `bytes` at `ref`, aligned to `alignment`, of a region of the tenant;
  // one table lookup per region and request. The view's keep_alive is
  // left empty: seen_ holds the region.
  absl::StatusOr<RegionView> Resolve(const v1::TensorRef& ref, uint64_t bytes, uint64_t alignment, int index,
                                     const char* field);
  // One input tensor, inline or by `ref` (null: inline): a decode step's
  // key or value into *out16 in bf16 (*out: float scratch), or, with
  // `in_place` set, a query: *in_place points at its floats (in place when
  // possible; *out holds converted ones), or the device reads it. `field`
  // and `ref_field` ("query", "query_ref") name the two ways in messages.
  absl::Status HostTensor(const v1::AttendItem& item, int index, const char* field, const char* ref_field,
                          absl::string_view inline_bytes, const v1::TensorRef* ref, size_t elements, float limit,
                          std::vector<float>* out, std::vector<uint16_t>* out16, const float** in_place, int* read,
                          ItemIo* io);

  RegionTable* const regions_;
  PinnedStagingPool* const staging_;
  PinnedStagingPool::Lease staged_;                   // this request's pinned staging
  absl::Span<const absl::string_view> wire_queries_;  // empty: the items' own
  // Item `index`'s inline query bytes: from the wire when given, else its field.
  absl::string_view QueryBytes(const v1::AttendItem& item, int index) const {
    return static_cast<size_t>(index) < wire_queries_.size() ? wire_queries_[index] : absl::string_view(item.query());
  }
  StagedOutputs* leave_ = nullptr;  // LeaveStagedOutputs
  Backend* const backend_;
  const std::string& tenant_;
  const int head_dim_, n_;
  const float value_limit_;
  const bool device_reads_;
  // Every region this request resolved, looked up once each; holding them
  // keeps their memory mapped until the request is done.
  absl::InlinedVector<std::shared_ptr<const Region>, 4> seen_;
  bool any_step_ = false;         // an item has a decode step
  bool check_in_launch_ = false;  // queries are checked by the attention launch
  // The item's error for element `bad` of its query.
  absl::Status QueryError(int index, const ItemIo& io, int64_t bad) const;

  // Queries the host can read, checked by ReadClientTensors when the
  // request has a decode step.
  struct HostQuery {
    int index;
    const ItemIo* io;
    size_t elements;
  };
  std::vector<HostQuery> host_queries_;
  std::vector<ClientRead> reads_;
  std::vector<std::pair<int, const char*>> read_fields_;  // item index and field of each read
  std::vector<std::vector<uint16_t>*> read_bf16_;         // each read's bf16 destination (null: a query)
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_IO_H_
