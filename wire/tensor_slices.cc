#include "wire/tensor_slices.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace driftkv {
namespace {

constexpr uint32_t kItemsField = 1;
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

  // A varint of at most `max_bytes` bytes (the bits past 64 dropped, as
  // protobuf reads them); its bytes as they came appended to *raw when raw
  // is set.
  bool ReadVarint(uint64_t* v, std::string* raw = nullptr, int max_bytes = 10) {
    *v = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      if (raw != nullptr) raw->push_back(static_cast<char>(b));
      if (shift < 64) *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // A field's tag as protobuf's parser reads one: at most 5 bytes, a field
  // number from 1 to 2^29 - 1 (protobuf keeps the low 32 bits of a longer
  // value; refusing those is the stricter choice).
  bool ReadTag(uint64_t* tag, std::string* raw = nullptr) {
    return ReadVarint(tag, raw, 5) && (*tag >> 3) != 0 && (*tag >> 3) <= 0x1fffffff;
  }
  // A length as protobuf's parser reads one: at most 5 bytes, below 2^31
  // less its 16 bytes of slop. The tags and lengths that this reader
  // writes again in canonical form (an element's, a tensor's) must meet
  // protobuf's rules here, where protobuf will not see them as they came.
  bool ReadSize(uint64_t* n) { return ReadVarint(n, nullptr, 5) && *n <= 0x7fffffff - 16; }
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

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

}  // namespace

void TensorSlicesReader::Release() {
  slices_.clear();
  tensors_.clear();
  joined_.clear();
  if (skeleton_.capacity() > kKeptBytes) {
    std::string().swap(skeleton_);
  } else {
    skeleton_.clear();
  }
}

bool TensorSlicesReader::Parse(const grpc::ByteBuffer& buffer, uint32_t tensor_field,
                               google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    message->Clear();
    tensors_.clear();
    return false;
  }
  return Parse(std::move(slices), tensor_field, message);
}

bool TensorSlicesReader::Parse(std::vector<grpc::Slice> slices, uint32_t tensor_field,
                               google::protobuf::MessageLite* message) {
  slices_ = std::move(slices);
  message->Clear();
  tensors_.clear();
  joined_.clear();
  skeleton_.clear();
  SliceReader r(slices_);
  std::string item;
  bool ok = true;
  while (ok && r.left() > 0) {
    uint64_t tag;
    std::string raw_tag;
    if (!r.ReadTag(&tag, &raw_tag)) {
      ok = false;
      break;
    }
    if ((tag >> 3) != kItemsField || (tag & 7) != kLengthDelimited) {
      skeleton_ += raw_tag;
      ok = r.Payload(static_cast<uint32_t>(tag & 7), &skeleton_);
      continue;
    }
    // An element: its fields but the tensor into `item`, the tensor as a view.
    uint64_t length;
    if (!r.ReadSize(&length) || length > r.left()) {
      ok = false;
      break;
    }
    const size_t end = r.left() - static_cast<size_t>(length);  // what is left after the element
    item.clear();
    absl::string_view tensor;
    while (ok && r.left() > end) {
      uint64_t t;
      const size_t field_start = item.size();
      if (!r.ReadTag(&t, &item)) {
        ok = false;
      } else if ((t >> 3) == tensor_field && (t & 7) == kLengthDelimited) {
        item.resize(field_start);  // the tensor stays out of the element's bytes
        uint64_t n;
        ok = r.ReadSize(&n) && r.left() >= end && n <= r.left() - end &&
             r.Take(static_cast<size_t>(n), &tensor, &joined_);
      } else {
        ok = r.Payload(static_cast<uint32_t>(t & 7), &item);
      }
      ok = ok && r.left() >= end;  // no field runs past the element
    }
    if (!ok) break;
    PutVarint(tag, &skeleton_);
    PutVarint(item.size(), &skeleton_);
    skeleton_ += item;
    tensors_.push_back(tensor);
  }
  if (ok) ok = message->ParseFromString(skeleton_);
  if (!ok) {
    message->Clear();
    tensors_.clear();
  }
  return ok;
}

grpc::ByteBuffer TensorSlicesBuffer(absl::Span<const google::protobuf::MessageLite* const> items, uint32_t tensor_field,
                                    absl::Span<const absl::string_view> tensors,
                                    absl::FunctionRef<grpc::Slice(absl::string_view)> slice_of) {
  const uint64_t tensor_tag = (static_cast<uint64_t>(tensor_field) << 3) | kLengthDelimited;
  constexpr char kItemTag = static_cast<char>((kItemsField << 3) | kLengthDelimited);
  // Everything but the tensors (tags, lengths, the items' own bytes) in
  // one string; `cuts` are where a tensor's slice goes between its pieces.
  std::string meta;
  std::vector<size_t> cuts;
  std::vector<absl::string_view> cut_tensors;
  meta.reserve(items.size() * 192);
  for (size_t i = 0; i < items.size(); ++i) {
    const absl::string_view tensor = i < tensors.size() ? tensors[i] : absl::string_view();
    const size_t rest = items[i]->ByteSizeLong();
    const size_t body =
        rest + (tensor.empty() ? 0 : VarintBytes(tensor_tag) + VarintBytes(tensor.size()) + tensor.size());
    meta.push_back(kItemTag);
    PutVarint(body, &meta);
    if (!tensor.empty()) {
      PutVarint(tensor_tag, &meta);
      PutVarint(tensor.size(), &meta);
      cuts.push_back(meta.size());
      cut_tensors.push_back(tensor);
    }
    items[i]->AppendToString(&meta);
  }
  grpc::Slice all(meta.data(), meta.size());  // one copy of the small bytes
  std::vector<grpc::Slice> slices;
  slices.reserve(2 * cuts.size() + 1);
  size_t at = 0;
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (cuts[k] > at) slices.push_back(all.sub(at, cuts[k]));
    slices.push_back(slice_of(cut_tensors[k]));
    at = cuts[k];
  }
  if (meta.size() > at) slices.push_back(all.sub(at, meta.size()));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace driftkv
