#include "service/attend_request_wire.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace driftkv {
namespace {

constexpr uint32_t kItemsField = 1;  // AttendRequest.items
constexpr uint32_t kQueryField = 5;  // AttendItem.query
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Bytes spread over slices, read front to back; every read is bounds
// checked against what is left.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) left_ += s.size();
    Settle();
  }
  size_t left() const { return left_; }

  // A varint of at most 10 bytes (the bits past 64 dropped, as protobuf
  // reads them); its bytes as they came appended to *raw when raw is set.
  bool ReadVarint(uint64_t* v, std::string* raw = nullptr) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      if (raw != nullptr) raw->push_back(static_cast<char>(b));
      if (shift < 64) *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // The next `n` bytes: a view into their slice, or joined into *joined
  // when they straddle slices.
  bool Take(size_t n, absl::string_view* out, std::deque<std::string>* joined) {
    if (n > left_) return false;
    if (n == 0) {
      *out = absl::string_view();
      return true;
    }
    const grpc::Slice& s = slices_[slice_];
    if (s.size() - offset_ >= n) {
      *out = absl::string_view(reinterpret_cast<const char*>(s.begin()) + offset_, n);
      Advance(n);
      return true;
    }
    joined->emplace_back();
    if (!Append(n, &joined->back())) return false;
    *out = joined->back();
    return true;
  }
  // Appends the next `n` bytes to *out.
  bool Append(size_t n, std::string* out) {
    if (n > left_) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[slice_];
      const size_t k = std::min(n, s.size() - offset_);
      out->append(reinterpret_cast<const char*>(s.begin()) + offset_, k);
      Advance(k);
      n -= k;
    }
    return true;
  }
  // Skips a field's payload of wire type `type` (its tag read), appending
  // it to *out when out is set; false for a group or an unknown type,
  // which protobuf's parser refuses here too, or past the end.
  bool Payload(uint32_t type, std::string* out) {
    switch (type) {
      case kVarint: {
        uint64_t v;
        return ReadVarint(&v, out);
      }
      case kFixed64: return Bytes(8, out);
      case kFixed32: return Bytes(4, out);
      case kLengthDelimited: {
        uint64_t n;
        if (!ReadVarint(&n, out) || n > left_) return false;
        return Bytes(static_cast<size_t>(n), out);
      }
      default: return false;
    }
  }

 private:
  bool ReadByte(uint8_t* b) {
    if (left_ == 0) return false;
    *b = slices_[slice_].begin()[offset_];
    Advance(1);
    return true;
  }
  bool Bytes(size_t n, std::string* out) {
    if (n > left_) return false;
    if (out != nullptr) return Append(n, out);
    Skip(n);
    return true;
  }
  void Skip(size_t n) {
    while (n > 0) {
      const size_t k = std::min(n, slices_[slice_].size() - offset_);
      Advance(k);
      n -= k;
    }
  }
  void Advance(size_t k) {
    offset_ += k;
    left_ -= k;
    Settle();
  }
  // Past empty and finished slices.
  void Settle() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0, offset_ = 0, left_ = 0;
};

}  // namespace

bool AttendRequestWire::Parse(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    request_.Clear();
    queries_.clear();
    return false;
  }
  return Parse(std::move(slices));
}

bool AttendRequestWire::Parse(std::vector<grpc::Slice> slices) {
  slices_ = std::move(slices);
  request_.Clear();
  queries_.clear();
  joined_.clear();
  skeleton_.clear();
  SliceReader r(slices_);
  std::string item;
  bool ok = true;
  while (ok && r.left() > 0) {
    uint64_t tag;
    std::string raw_tag;
    if (!r.ReadVarint(&tag, &raw_tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) {
      ok = false;
      break;
    }
    if ((tag >> 3) != kItemsField || (tag & 7) != kLengthDelimited) {
      skeleton_ += raw_tag;
      ok = r.Payload(static_cast<uint32_t>(tag & 7), &skeleton_);
      continue;
    }
    // An item: its fields but the query into `item`, the query as a view.
    uint64_t length;
    if (!r.ReadVarint(&length) || length > r.left()) {
      ok = false;
      break;
    }
    const size_t end = r.left() - static_cast<size_t>(length);  // what is left after the item
    item.clear();
    absl::string_view query;
    while (ok && r.left() > end) {
      uint64_t t;
      const size_t field_start = item.size();
      if (!r.ReadVarint(&t, &item) || (t >> 3) == 0 || (t >> 3) > 0x1fffffff) {
        ok = false;
      } else if ((t >> 3) == kQueryField && (t & 7) == kLengthDelimited) {
        item.resize(field_start);  // the query stays out of the item's bytes
        uint64_t n;
        ok = r.ReadVarint(&n) && r.left() >= end && n <= r.left() - end &&
             r.Take(static_cast<size_t>(n), &query, &joined_);
      } else {
        ok = r.Payload(static_cast<uint32_t>(t & 7), &item);
      }
      ok = ok && r.left() >= end;  // no field runs past the item
    }
    if (!ok) break;
    PutVarint(tag, &skeleton_);
    PutVarint(item.size(), &skeleton_);
    skeleton_ += item;
    queries_.push_back(query);
  }
  if (ok) ok = request_.ParseFromString(skeleton_) && request_.items_size() == static_cast<int>(queries_.size());
  if (!ok) {
    request_.Clear();
    queries_.clear();
  }
  return ok;
}

}  // namespace driftkv
