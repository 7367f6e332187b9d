// The Attend items of the data-plane tests (tests/data_plane_test.cc on
// the CPU backend, tests/data_plane_gpu_test.cc on the CUDA backend): an
// item described once (ItemSpec), encoded inline or with every tensor by
// reference into an Arena of a registered region, and its answer as bytes
// wherever the server wrote it, so that the two ways compare byte for byte.
#ifndef DRIFTKV_TESTS_DATA_PLANE_ITEMS_H_
#define DRIFTKV_TESTS_DATA_PLANE_ITEMS_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "client/regions.h"
#include "gtest/gtest.h"
#include "proto/driftkv.pb.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace testing {

constexpr int kD = 64;  // SmallOptions' head_dim

// One Attend item before it is encoded inline or by reference.
struct ItemSpec {
  std::string seq;  // without the prefix of its set of sequences
  uint32_t layer = 0;
  int q_heads = 2;
  v1::DType dtype = v1::DTYPE_F32;  // of query, new_key and new_value
  v1::DType out_dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<float> query;
  std::vector<float> key, value;  // empty: no decode step
  std::optional<uint64_t> token_index;
};

inline size_t OutBytes(const ItemSpec& s) {
  return static_cast<size_t>(s.q_heads) * kD * (s.out_dtype == v1::DTYPE_BF16 ? 2 : 4);
}

// Tensors in a registered region, each at a 64-byte aligned offset from
// the start; Reset starts over.
class Arena {
 public:
  Arena(uint64_t id, uint64_t size) : id_(id), size_(size) {}
  virtual ~Arena() = default;
  // `bytes` copied into the region.
  v1::TensorRef Put(const std::string& bytes) {
    v1::TensorRef ref = Next(bytes.size());
    Write(ref.offset(), bytes);
    return ref;
  }
  // Room for `bytes`, filled with 0xa5 so that an answer not written shows.
  v1::TensorRef Take(size_t bytes) {
    v1::TensorRef ref = Next(bytes);
    Write(ref.offset(), std::string(bytes, '\xa5'));
    return ref;
  }
  virtual std::string Bytes(const v1::TensorRef& ref, size_t bytes) const = 0;
  void Reset() { next_ = 0; }

 protected:
  virtual void Write(uint64_t offset, const std::string& bytes) = 0;

 private:
  v1::TensorRef Next(size_t bytes) {
    v1::TensorRef ref;
    ref.set_region_id(id_);
    ref.set_offset(next_);
    next_ = (next_ + bytes + 63) / 64 * 64;
    EXPECT_LE(next_, size_) << "the test's region is too small";
    return ref;
  }
  const uint64_t id_, size_;
  uint64_t next_ = 0;
};

// An Arena in a HostRegion (client/regions.h): plain host memory.
class HostArena : public Arena {
 public:
  explicit HostArena(HostRegion* region) : Arena(region->id(), region->size()), region_(region) {}
  std::string Bytes(const v1::TensorRef& ref, size_t bytes) const override { return std::string(At(ref), bytes); }
  char* At(const v1::TensorRef& ref) const { return static_cast<char*>(region_->data()) + ref.offset(); }

 private:
  void Write(uint64_t offset, const std::string& bytes) override {
    std::memcpy(static_cast<char*>(region_->data()) + offset, bytes.data(), bytes.size());
  }
  HostRegion* region_;
};

inline v1::AttendItem Inline(const ItemSpec& s, const std::string& prefix) {
  v1::AttendItem it = QueryItem(prefix + s.seq, s.layer, s.query, s.q_heads, s.dtype);
  it.set_output_dtype(s.out_dtype);
  if (!s.key.empty()) {
    FloatToTensor(s.key.data(), s.key.size(), s.dtype, it.mutable_new_key());
    FloatToTensor(s.value.data(), s.value.size(), s.dtype, it.mutable_new_value());
  }
  if (s.token_index.has_value()) it.set_new_token_index(*s.token_index);
  return it;
}

// Inline's item with every tensor moved into `arena`, and room there for
// the output and the lse.
inline v1::AttendItem ByRef(const ItemSpec& s, const std::string& prefix, Arena& arena) {
  v1::AttendItem it = Inline(s, prefix);
  *it.mutable_query_ref() = arena.Put(it.query());
  it.clear_query();
  if (!s.key.empty()) {
    *it.mutable_new_key_ref() = arena.Put(it.new_key());
    *it.mutable_new_value_ref() = arena.Put(it.new_value());
    it.clear_new_key();
    it.clear_new_value();
  }
  *it.mutable_output_ref() = arena.Take(OutBytes(s));
  *it.mutable_lse_ref() = arena.Take(static_cast<size_t>(s.q_heads) * 4);
  return it;
}

// One item's answer as bytes, wherever it was written.
struct Answer {
  std::string output, lse;
  uint64_t tokens = 0;
};

inline Answer InlineAnswer(const v1::AttendResult& r) {
  return Answer{r.output(), std::string(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * 4), r.tokens()};
}

inline Answer RefAnswer(const ItemSpec& s, const v1::AttendItem& it, const v1::AttendResult& r, const Arena& arena) {
  EXPECT_TRUE(r.output().empty()) << "an output by reference is not returned inline too";
  EXPECT_EQ(r.lse_size(), 0);
  return Answer{arena.Bytes(it.output_ref(), OutBytes(s)), arena.Bytes(it.lse_ref(), s.q_heads * 4), r.tokens()};
}

inline void ExpectSame(const Answer& want, const Answer& got, const std::string& what) {
  EXPECT_EQ(want.output.size(), got.output.size()) << what;
  EXPECT_TRUE(want.output == got.output) << what << ": outputs differ";
  EXPECT_TRUE(want.lse == got.lse) << what << ": lse differ";
  EXPECT_EQ(want.tokens, got.tokens) << what;
}

inline std::vector<float> Gaussian(size_t count, uint32_t seed) {
  return SyntheticQuery(1, static_cast<int>(count), seed);
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_DATA_PLANE_ITEMS_H_
