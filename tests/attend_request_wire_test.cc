// AttendRequestWire (service/attend_request_wire.h): the request protobuf
// would parse, its queries as views, however gRPC cut the bytes; refusals
// where protobuf refuses.
#include "service/attend_request_wire.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <random>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

// `bytes` cut into slices of the given lengths (cycled).
std::vector<grpc::Slice> Cut(const std::string& bytes, const std::vector<size_t>& lengths) {
  std::vector<grpc::Slice> out;
  for (size_t at = 0, k = 0; at < bytes.size(); ++k) {
    const size_t n = std::min(bytes.size() - at, lengths[k % lengths.size()]);
    out.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return out;
}

v1::AttendRequest Request(std::mt19937* rng, int items) {
  v1::AttendRequest r;
  for (int i = 0; i < items; ++i) {
    v1::AttendItem* it = r.add_items();
    it->set_sequence_id("seq-" + std::to_string(i));
    it->set_layer(i % 5);
    it->set_q_heads(4);
    it->set_dtype(v1::DTYPE_BF16);
    it->set_output_dtype(v1::DTYPE_BF16);
    std::string q(4 * 64 * 2, '\0');
    for (char& c : q) c = static_cast<char>((*rng)());
    if (i % 4 == 3) {
      it->mutable_query_ref()->set_region_id(9);
      it->mutable_query_ref()->set_offset(4096u * i);
    } else {
      it->set_query(q);
    }
    if (i % 3 == 1) {
      it->set_new_key(q.substr(0, 256));
      it->set_new_value(q.substr(256, 256));
      it->set_new_token_index(1000 + i);
    }
  }
  return r;
}

// The reader's request with its queries put back, against protobuf's.
void ExpectSameAsProtobuf(const AttendRequestWire& wire, const v1::AttendRequest& want) {
  ASSERT_EQ(static_cast<int>(wire.tensors().size()), wire.message().items_size());
  v1::AttendRequest got = wire.message();
  for (int i = 0; i < got.items_size(); ++i) {
    EXPECT_TRUE(got.items(i).query().empty()) << i;
    got.mutable_items(i)->set_query(std::string(wire.tensors()[i]));
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want));
}

TEST(AttendRequestWire, SameRequestHoweverTheBytesAreCut) {
  std::mt19937 rng(3);
  const v1::AttendRequest want = Request(&rng, 12);
  const std::string bytes = want.SerializeAsString();
  for (const std::vector<size_t>& cut :
       std::vector<std::vector<size_t>>{{bytes.size()}, {1}, {7, 1, 300}, {4096}, {513, 2}, {64}}) {
    AttendRequestWire wire;
    ASSERT_TRUE(wire.Parse(Cut(bytes, cut))) << cut[0];
    ExpectSameAsProtobuf(wire, want);
  }
}

// One reader used again, as a serving thread uses its own: after Release
// it holds no views and no slices, and the next request reads as if
// fresh, however many items the one before had, a failed read included;
// one larger than the reader keeps on the wire leaves a fresh message.
TEST(AttendRequestWire, ReadAgainAfterRelease) {
  std::mt19937 rng(8);
  AttendRequestWire wire;
  for (int items : {12, 3, 0, 40, 1}) {
    const v1::AttendRequest want = Request(&rng, items);
    const std::string bytes = want.SerializeAsString();
    ASSERT_TRUE(wire.Parse(Cut(bytes, {97, 4096}))) << items;
    ExpectSameAsProtobuf(wire, want);
    wire.Release();
    EXPECT_EQ(wire.message().items_size(), 0);
    EXPECT_TRUE(wire.tensors().empty());
    // Truncated: refused, and nothing of it stays for the next read.
    if (bytes.size() > 1) {
      EXPECT_FALSE(wire.Parse(Cut(bytes.substr(0, bytes.size() - 1), {64})));
    }
    wire.Release();
  }
  v1::AttendRequest large = Request(&rng, 2);
  large.mutable_items(0)->set_new_key(std::string(AttendRequestWire::kKeptBytes + 1, 'k'));
  ASSERT_TRUE(wire.Parse(Cut(large.SerializeAsString(), {1 << 16})));
  ExpectSameAsProtobuf(wire, large);
  wire.Release();
  EXPECT_EQ(wire.message().items_size(), 0);
  const v1::AttendRequest after = Request(&rng, 4);
  ASSERT_TRUE(wire.Parse(Cut(after.SerializeAsString(), {1 << 16})));
  ExpectSameAsProtobuf(wire, after);
}

TEST(AttendRequestWire, QueriesInOneSliceAreViewsIntoIt) {
  std::mt19937 rng(4);
  const v1::AttendRequest want = Request(&rng, 3);
  const std::string bytes = want.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  const char* lo = reinterpret_cast<const char*>(slice.begin());
  AttendRequestWire wire;
  ASSERT_TRUE(wire.Parse(std::vector<grpc::Slice>{slice}));
  for (absl::string_view q : wire.tensors()) {
    if (q.empty()) continue;
    EXPECT_GE(q.data(), lo);
    EXPECT_LE(q.data() + q.size(), lo + slice.size());
  }
}

TEST(AttendRequestWire, FromAByteBuffer) {
  std::mt19937 rng(5);
  const v1::AttendRequest want = Request(&rng, 5);
  const std::string bytes = want.SerializeAsString();
  std::vector<grpc::Slice> slices = Cut(bytes, {100});
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  AttendRequestWire wire;
  ASSERT_TRUE(wire.Parse(buffer));
  ExpectSameAsProtobuf(wire, want);
}

TEST(AttendRequestWire, UnknownFieldsAndARepeatedQueryAsProtobufReadsThem) {
  v1::AttendRequest base;
  base.add_items()->set_sequence_id("a");
  std::string item = base.items(0).SerializeAsString();
  item += std::string("\x2a\x03", 2) + "abc";  // query "abc"
  item += std::string("\x98\x06\x05", 3);      // field 99, varint 5
  item += std::string("\x2a\x02", 2) + "zz";   // query again: "zz" wins
  item += std::string("\x28\x07", 2);          // field 5 as a varint: unknown
  std::string bytes = "\x0a" + std::string(1, static_cast<char>(item.size())) + item;
  bytes += std::string("\xa0\x06\x01", 3);  // field 100 of the request
  v1::AttendRequest want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  ASSERT_EQ(want.items(0).query(), "zz");
  for (size_t cut : {bytes.size(), size_t{1}, size_t{3}}) {
    AttendRequestWire wire;
    ASSERT_TRUE(wire.Parse(Cut(bytes, {cut})));
    EXPECT_EQ(wire.tensors()[0], "zz");
    ExpectSameAsProtobuf(wire, want);
  }
}

TEST(AttendRequestWire, EveryTruncationIsRefusedWhereProtobufRefusesIt) {
  std::mt19937 rng(6);
  const std::string bytes = Request(&rng, 4).SerializeAsString();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string prefix = bytes.substr(0, n);
    v1::AttendRequest want;
    const bool want_ok = want.ParseFromString(prefix);
    AttendRequestWire wire;
    const bool ok = wire.Parse(Cut(prefix, {37}));
    EXPECT_EQ(ok, want_ok) << n;
    if (ok) {
      ExpectSameAsProtobuf(wire, want);
    } else {
      EXPECT_EQ(wire.message().items_size(), 0);
      EXPECT_TRUE(wire.tensors().empty());
    }
  }
}

TEST(AttendRequestWire, CorruptBytesNeverAcceptWhatProtobufRefuses) {
  std::mt19937 rng(7);
  const std::string bytes = Request(&rng, 4).SerializeAsString();
  int accepted = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string b = bytes;
    for (int k = 0; k < 1 + round % 4; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    v1::AttendRequest want;
    const bool want_ok = want.ParseFromString(b);
    AttendRequestWire wire;
    const bool ok = wire.Parse(Cut(b, {1 + rng() % 200}));
    if (ok) {
      ASSERT_TRUE(want_ok) << round;
      ExpectSameAsProtobuf(wire, want);
      ++accepted;
    } else {
      ++refused;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

// Lengths and tags longer than 5 bytes, which protobuf's parser refuses
// (the reader writes an item's and drops a query's, so it must refuse them
// itself), and 5-byte ones, which it reads.
TEST(AttendRequestWire, OverlongLengthsAndTagsAsProtobufReadsThem) {
  const std::string query_field = std::string("\x2a", 1);
  for (const std::string& item_length :
       {std::string("\x05", 1), std::string("\x85\x80\x80\x80\x00", 5), std::string("\x85\x80\x80\x80\x80\x00", 6)}) {
    for (const std::string& query_length :
         {std::string("\x03", 1), std::string("\x83\x80\x80\x80\x00", 5), std::string("\x83\x80\x80\x80\x80\x00", 6)}) {
      for (const std::string& item_tag : {std::string("\x0a", 1), std::string("\x8a\x80\x80\x80\x00", 5),
                                          std::string("\x8a\x80\x80\x80\x80\x00", 6)}) {
        const std::string body = query_field + query_length + "abc";
        std::string length = item_length;
        length[0] = static_cast<char>((length[0] & 0x80) | body.size());
        const std::string bytes = item_tag + length + body;
        v1::AttendRequest want;
        const bool want_ok = want.ParseFromString(bytes);
        AttendRequestWire wire;
        const bool ok = wire.Parse(Cut(bytes, {3}));
        EXPECT_TRUE(!ok || want_ok) << item_length.size() << query_length.size() << item_tag.size();
        if (ok) {
          ExpectSameAsProtobuf(wire, want);
        }
        if (item_length.size() < 6 && query_length.size() < 6 && item_tag.size() < 6) {
          EXPECT_TRUE(ok);
        }
      }
    }
  }
}

TEST(AttendRequestWire, GroupsAreRefused) {
  // Field 99 as a start-group / end-group pair inside the request.
  const std::string bytes = std::string("\x9b\x06\x9c\x06", 4);
  AttendRequestWire wire;
  EXPECT_FALSE(wire.Parse(Cut(bytes, {4})));
}

}  // namespace
}  // namespace driftkv
