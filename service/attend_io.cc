#include "service/attend_io.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

std::string Field(int index, absl::string_view field) {
  return absl::StrCat("items[", index, "].", field);
}

}  // namespace

AttendIo::AttendIo(RegionTable* regions, PinnedStagingPool* staging, Backend* backend, const std::string& tenant,
                   int head_dim, int n, float value_limit)
    : regions_(regions),
      staging_(staging),
      backend_(backend),
      tenant_(tenant),
      head_dim_(head_dim),
      n_(n),
      value_limit_(value_limit),
      device_reads_(backend->AddressesClientMemory()) {}

void AttendIo::StageInline(const v1::AttendRequest& request) {
  if (staging_ == nullptr || !device_reads_) return;
  auto rounded = PinnedStagingPool::Lease::Claimed;
  uint64_t total = 0;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::AttendItem& it = request.items(i);
    if (!it.has_query_ref()) total += rounded(QueryBytes(it, i).size());
    const uint64_t q_heads = it.q_heads();
    if (it.has_output_ref() || q_heads == 0 || q_heads > 65536) continue;
    const uint64_t eb = it.output_dtype() == v1::DTYPE_BF16 ? 2 : 4;  // unspecified: f32
    total += rounded(q_heads * head_dim_ * eb) + rounded(q_heads * 4);
  }
  if (total == 0 || total > PinnedStagingPool::kMaxBytes) return;
  staged_ = staging_->Take(total);
}

absl::StatusOr<RegionView> AttendIo::Resolve(const v1::TensorRef& ref, uint64_t bytes, uint64_t alignment, int index,
                                             const char* field) {
  const Region* region = nullptr;
  for (const auto& r : seen_) {
    if (r->id() == ref.region_id()) region = r.get();
  }
  if (region == nullptr) {
    if (regions_ == nullptr) return RegionTable::NotFound(ref, Field(index, field));
    absl::StatusOr<std::shared_ptr<const Region>> found = regions_->Acquire(tenant_, ref, Field(index, field));
    if (!found.ok()) return found.status();
    region = found->get();
    seen_.push_back(*std::move(found));
  }
  const uint64_t offset = ref.offset(), size = region->size();
  if (offset > size || bytes > size - offset || offset % alignment != 0) {
    for (const auto& r : seen_) {
      if (r.get() == region) return RegionTable::View(r, ref, bytes, alignment, Field(index, field));  // the error
    }
  }
  RegionView view;
  view.data = static_cast<char*>(region->base()) + offset;
  view.space = region->space();
  view.device = region->device();
  return view;
}

absl::Status AttendIo::HostTensor(const v1::AttendItem& item, int index, const char* field, const char* ref_field,
                                  absl::string_view inline_bytes, const v1::TensorRef* ref, size_t elements,
                                  float limit, std::vector<float>* out, std::vector<uint16_t>* out16,
                                  const float** in_place, int* read, ItemIo* io) {
  const int dtype = item.dtype();
  const size_t eb = DTypeBytes(dtype);
  absl::string_view bytes = inline_bytes;
  if (ref != nullptr) {
    if (!inline_bytes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(Field(index, field), " and ", field, "_ref are both set"));
    }
    if (eb == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(index, "dtype"), " ", DTypeName(dtype), " is not bf16, fp16 or f32"));
    }
    absl::StatusOr<RegionView> view = Resolve(*ref, elements * eb, eb, index, ref_field);
    if (!view.ok()) return view.status();
    if (device_reads_ && in_place != nullptr && view->space == MemorySpace::kHost) {
      // A query in a host region the device reads where it is; the host
      // checks it in its wire form when the request steps (cheaper than a
      // device round trip). A client that changes it after its check
      // changes only its own answer.
      io->query_dev = view->data;
      io->query_dtype = dtype;
      io->query_host = view->data;
      io->query_host_dtype = dtype;
      io->query_by_ref = true;
      host_queries_.push_back({index, io, elements});
      return absl::OkStatus();
    }
    if (view->space == MemorySpace::kDevice) {
      // The device reads it where it is; checked by ReadClientTensors, or,
      // for a query of a call without decode steps, by the attention
      // launch itself (CheckQuery).
      if (!device_reads_) {
        return absl::FailedPreconditionError(absl::StrCat(Field(index, field), "_ref names device memory; the ",
                                                          backend_->name(), " backend reads host regions only"));
      }
      if (in_place != nullptr) {
        io->query_dev = view->data;
        io->query_dtype = dtype;
        *read = static_cast<int>(reads_.size());
        reads_.push_back(ClientRead{view->data, dtype, static_cast<int>(elements), nullptr, kQueryLimit});
        read_bf16_.push_back(nullptr);
      } else {
        out->resize(elements);
        *read = static_cast<int>(reads_.size());
        reads_.push_back(ClientRead{view->data, dtype, static_cast<int>(elements), out->data()});
        read_bf16_.push_back(out16);
      }
      read_fields_.emplace_back(index, field);
      return absl::OkStatus();
    }
    bytes = absl::string_view(static_cast<const char*>(view->data), elements * eb);
  } else {
    if (eb == 0 || bytes.size() != elements * eb) {
      // The field's name and shape are built only for the message.
      const std::string shape = in_place != nullptr
                                    ? absl::StrCat("q_heads ", elements / head_dim_, " x head_dim ", head_dim_)
                                    : absl::StrCat("1 token x kv_heads ", n_ / head_dim_, " x head_dim ", head_dim_);
      return CheckTensorBytes(Field(index, field), dtype, bytes.size(), elements, shape);
    }
    void* staged = in_place != nullptr ? staged_.Claim(bytes.size()) : nullptr;
    if (staged != nullptr) {
      // The device reads the query in its wire dtype from pinned staging,
      // as it reads one in a host region (see StageInline).
      std::memcpy(staged, bytes.data(), bytes.size());
      io->query_dev = staged;
      io->query_dtype = dtype;
      io->query_host = staged;
      io->query_host_dtype = dtype;
      io->query_by_ref = false;
      host_queries_.push_back({index, io, elements});
      return absl::OkStatus();
    }
  }
  if (in_place == nullptr && dtype == v1::DTYPE_BF16) {
    // A step's bf16 token: copied (a region may change under us) and
    // checked in the window's own form.
    out16->resize(elements);
    std::memcpy(out16->data(), bytes.data(), elements * sizeof(uint16_t));
    if (CheckBf16Values("", out16->data(), elements, limit).ok()) return absl::OkStatus();
    return CheckBf16Values(ref != nullptr ? absl::StrCat(Field(index, field), "_ref") : Field(index, field),
                           out16->data(), elements, limit);
  }
  const float* values;
  if (in_place != nullptr && dtype == v1::DTYPE_F32 &&
      reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
    values = reinterpret_cast<const float*>(bytes.data());
    *in_place = values;
  } else {
    out->resize(elements);
    TensorToFloat(bytes, dtype, elements, out->data());
    values = out->data();
    if (in_place != nullptr) *in_place = values;
  }
  if (in_place != nullptr) {
    io->query_host = values;
    io->query_host_dtype = v1::DTYPE_F32;
    io->query_by_ref = ref != nullptr;
    host_queries_.push_back({index, io, elements});
    return absl::OkStatus();
  }
  // The field's name is built only for a message.
  if (!CheckValues("", values, elements, limit).ok()) {
    return CheckValues(ref != nullptr ? absl::StrCat(Field(index, field), "_ref") : Field(index, field), values,
                       elements, limit);
  }
  out16->resize(elements);
  FloatsToBf16(values, elements, out16->data());
  return absl::OkStatus();
}

absl::Status AttendIo::Prepare(const v1::AttendItem& it, int index, size_t qe, ItemIo* io) {
  // Output first: its dtype decides nothing else, but a bad one is cheap to
  // find.
  const int out_dtype = it.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : it.output_dtype();
  if (out_dtype != v1::DTYPE_F32 && out_dtype != v1::DTYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(Field(index, "output_dtype"), " ", DTypeName(out_dtype), " is not f32 or bf16"));
  }
  io->out_dtype = out_dtype;
  absl::Status st =
      HostTensor(it, index, "query", "query_ref", QueryBytes(it, index), it.has_query_ref() ? &it.query_ref() : nullptr,
                 qe, std::numeric_limits<float>::max(), &io->converted, nullptr, &io->query, &io->query_read, io);
  if (!st.ok()) return st;
  io->step = !it.new_key().empty() || !it.new_value().empty() || it.has_new_key_ref() || it.has_new_value_ref();
  any_step_ = any_step_ || io->step;
  if (io->step) {
    st = HostTensor(it, index, "new_key", "new_key_ref", it.new_key(),
                    it.has_new_key_ref() ? &it.new_key_ref() : nullptr, n_, value_limit_, &io->key, &io->key16, nullptr,
                    &io->key_read, io);
    if (st.ok()) {
      st = HostTensor(it, index, "new_value", "new_value_ref", it.new_value(),
                      it.has_new_value_ref() ? &it.new_value_ref() : nullptr, n_, value_limit_, &io->value,
                      &io->value16, nullptr, &io->value_read, io);
    }
    if (!st.ok()) return st;
  }
  if (it.has_output_ref() != it.has_lse_ref()) {
    return absl::InvalidArgumentError(absl::StrCat(Field(index, "output_ref"), " and lse_ref: set both or neither"));
  }
  if (it.has_output_ref()) {
    const size_t eb = DTypeBytes(out_dtype);
    const size_t q_heads = qe / head_dim_;
    absl::StatusOr<RegionView> out = Resolve(it.output_ref(), qe * eb, eb, index, "output_ref");
    if (!out.ok()) return out.status();
    absl::StatusOr<RegionView> lse = Resolve(it.lse_ref(), q_heads * 4, 4, index, "lse_ref");
    if (!lse.ok()) return lse.status();
    if (!device_reads_ && (out->space == MemorySpace::kDevice || lse->space == MemorySpace::kDevice)) {
      return absl::FailedPreconditionError(absl::StrCat(Field(index, "output_ref"), " names device memory; the ",
                                                        backend_->name(), " backend writes host regions only"));
    }
    io->out_ref = out->data;
    io->lse_ref = static_cast<float*>(lse->data);
    io->out_ref_device = device_reads_;
  } else if (device_reads_) {
    const size_t eb = DTypeBytes(out_dtype);
    void* out = staged_.Claim(qe * eb);
    void* lse = out != nullptr ? staged_.Claim(qe / head_dim_ * 4) : nullptr;
    if (lse != nullptr) {
      io->out_ref = out;
      io->lse_ref = static_cast<float*>(lse);
      io->out_ref_device = true;
      io->out_staged = true;
    }
  }
  return absl::OkStatus();
}

absl::Status AttendIo::ReadClientTensors() {
  if (!any_step_) {
    // Nothing but queries, and the call changes no state: the backend
    // checks them as it reads them (AttendJob::check_query).
    check_in_launch_ = true;
    return absl::OkStatus();
  }
  for (const HostQuery& q : host_queries_) {
    const int64_t bad = FirstOutOfRange(q.io->query_host, q.io->query_host_dtype, q.elements, kQueryLimit);
    if (bad >= 0) return QueryError(q.index, *q.io, bad);
  }
  if (reads_.empty()) return absl::OkStatus();
  absl::Status st = backend_->ReadClientTensors(absl::MakeSpan(reads_));
  if (!st.ok()) return st;
  for (size_t r = 0; r < reads_.size(); ++r) {
    const auto& [index, field] = read_fields_[r];
    const ClientRead& read = reads_[r];
    if (read.bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(index, field), "_ref element ", read.bad, " is not finite",
                       read.limit < std::numeric_limits<float>::max() ? absl::StrCat(" or |x| > ", read.limit) : ""));
    }
    if (read.host != nullptr) {
      if (!CheckValues("", read.host, read.elements, value_limit_).ok()) {
        return CheckValues(absl::StrCat(Field(index, field), "_ref"), read.host, read.elements, value_limit_);
      }
      std::vector<uint16_t>* out16 = read_bf16_[r];
      out16->resize(read.elements);
      FloatsToBf16(read.host, read.elements, out16->data());
    }
  }
  return absl::OkStatus();
}

void AttendIo::Bind(ItemIo* io, size_t qe, int q_heads, AttendJob* job, v1::AttendResult* result) {
  job->query = io->query;
  job->query_dev = io->query_dev;
  job->query_dtype = io->query_dtype;
  job->check_query = check_in_launch_;
  if (io->out_ref != nullptr && io->out_ref_device) {
    job->out_dev = io->out_ref;
    job->out_dtype = io->out_dtype;
    job->lse_dev = io->lse_ref;
    job->out = nullptr;
    job->lse = nullptr;
    return;
  }
  if (io->out_ref != nullptr) {
    job->lse = io->lse_ref;
    if (io->out_dtype == v1::DTYPE_F32) {
      job->out = static_cast<float*>(io->out_ref);
      return;
    }
  } else {
    io->lse_scratch.resize(q_heads);
    job->lse = io->lse_scratch.data();
    if (io->out_dtype == v1::DTYPE_F32) {
      result->mutable_output()->resize(qe * sizeof(float));
      job->out = reinterpret_cast<float*>(result->mutable_output()->data());
      return;
    }
  }
  io->out_scratch.resize(qe);
  job->out = io->out_scratch.data();
}

absl::Status AttendIo::CheckQuery(int index, const ItemIo& io, const AttendJob& job) const {
  if (job.query_bad < 0) return absl::OkStatus();
  return QueryError(index, io, job.query_bad);
}

absl::Status AttendIo::QueryError(int index, const ItemIo& io, int64_t bad) const {
  const std::string field = Field(index, io.query_by_ref || io.query_host == nullptr ? "query_ref" : "query");
  if (io.query_host != nullptr) {
    // The value, as the check saw it unless the client changed it since.
    const size_t eb = DTypeBytes(io.query_host_dtype);
    float v = 0.0f;
    TensorToFloat(absl::string_view(static_cast<const char*>(io.query_host) + bad * eb, eb), io.query_host_dtype, 1,
                  &v);
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " element ", bad, " is ", v, "; must be finite"));
    }
    if (std::fabs(v) > kQueryLimit) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " element ", bad, " is ", v, "; |x| must be <= ", kQueryLimit));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(field, " element ", bad, " is not finite or |x| > ", kQueryLimit));
}

void AttendIo::Finish(ItemIo* io, int index, size_t qe, int q_heads, v1::AttendResult* result) {
  if (io->out_staged) {
    const size_t eb = DTypeBytes(io->out_dtype);
    const absl::string_view bytes(static_cast<const char*>(io->out_ref), qe * eb);
    if (leave_ != nullptr) {
      if (leave_->outputs.size() <= static_cast<size_t>(index)) leave_->outputs.resize(index + 1);
      leave_->outputs[index] = bytes;
    } else {
      result->mutable_output()->assign(bytes.data(), bytes.size());
    }
    result->mutable_lse()->Assign(io->lse_ref, io->lse_ref + q_heads);
    return;
  }
  if (io->out_ref != nullptr && io->out_ref_device) return;
  if (io->out_ref == nullptr) {
    result->mutable_lse()->Assign(io->lse_scratch.begin(), io->lse_scratch.end());
    if (io->out_dtype == v1::DTYPE_BF16)
      FloatToTensor(io->out_scratch.data(), qe, v1::DTYPE_BF16, result->mutable_output());
    return;
  }
  if (io->out_dtype == v1::DTYPE_BF16) {
    FloatsToBf16(io->out_scratch.data(), qe, static_cast<uint16_t*>(io->out_ref));
  }
}

bool AttendIo::Keepable(absl::Span<const ItemIo* const> items) const {
  if (!device_reads_ || any_step_) return false;
  for (const ItemIo* io : items) {
    // An inline query is staged (query_host set, not by reference).
    const bool query_inline = !io->query_by_ref && io->query_host != nullptr;
    if (io->step || io->query_dev == nullptr || query_inline || io->out_ref == nullptr || !io->out_ref_device ||
        io->out_staged) {
      return false;
    }
  }
  return true;
}

bool AttendIo::AcquireAgain(absl::Span<const uint64_t> ids) {
  if (regions_ == nullptr) return false;
  for (uint64_t id : ids) {
    v1::TensorRef ref;
    ref.set_region_id(id);
    absl::StatusOr<std::shared_ptr<const Region>> r = regions_->Acquire(tenant_, ref, "kept");
    if (!r.ok()) return false;
    seen_.push_back(*std::move(r));
  }
  return true;
}

void AttendIo::HandOverStaging() {
  if (leave_ == nullptr || leave_->outputs.empty()) return;
  leave_->lease = std::make_shared<PinnedStagingPool::Lease>(std::move(staged_));
}

}  // namespace driftkv
