// Writes the seed corpora of the fuzz targets (fuzz/corpus/TARGET/*): valid
// inputs of each format, made by the code that writes them, so that the
// fuzzers start from inputs that pass the first checks. Built by
// //fuzz:make_seeds and run by hand; the output is committed.
//
//   make_seeds DIR [GOLDEN_POOL]   (fuzz/corpus tests/testdata/golden_dquant.dkv)
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "codec/level_page.h"
#include "codec/transform/transforms_file.h"
#include "fuzz/fuzz_util.h"
#include "proto/driftkv.pb.h"
#include "service/snapshot_file.h"
#include "tiers/disk_format.h"
#include "wire/doorbell.h"

using namespace driftkv;

namespace {

void Put(const std::string& dir, const std::string& name, const std::string& bytes) {
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}
std::string Bytes(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string out = argv[1];
  mkdir(out.c_str(), 0755);
  const DQuantCodec& codec = fuzz::SmallCodec();
  const PageLayout l = codec.page_layout();
  const int p = codec.config().mean_window, n = codec.n();
  std::vector<float> k(p * n), v(p * n);
  for (int i = 0; i < p * n; ++i) {
    k[i] = std::sin(0.37f * i) + (i % n == 3 ? 4.0f : 0.0f);
    v[i] = std::cos(0.11f * i);
  }
  std::vector<uint8_t> cold(l.page_bytes);
  CodecScratch scratch;
  StreamStats ks, vs;
  if (!codec
           .EncodeWindow(k.data(), v.data(), p, cold.data(), cold.data() + l.value_offset, cold.data() + l.mean_offset,
                         &scratch, &ks, &vs)
           .ok()) {
    return 1;
  }
  Put(out + "/fuzz_record", "encoded_page", Bytes(cold));
  const LevelPageLayout level = *MakeLevelPageLayout(codec);
  std::vector<uint8_t> hot(level.page_bytes);
  if (!PromotePage(codec, level, cold.data(), cold.data() + l.value_offset, cold.data() + l.mean_offset, p, hot.data())
           .ok()) {
    return 1;
  }
  std::string hot_seed = Bytes(hot);
  hot_seed[0] = static_cast<char>(p - 1);  // the first byte also picks the token count: all of them
  Put(out + "/fuzz_level_page", "promoted_page", hot_seed);
  // rANS: levels, n, capacity, frequencies, payload bytes.
  Put(out + "/fuzz_rans", "eight_levels",
      std::string("\x06\x3f\x20\x05\x0a\x0f\x03\x01\x02\x04\x08"
                  "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                  37));
  Put(out + "/fuzz_rans", "two_levels", std::string("\x00\x7f\x7c\x00\x00\x01\x02\x03\x04", 9));
  // Transforms: an identity set of 1 layer x 1 head x 16.
  TransformSet t;
  t.layers = 1;
  t.kv_heads = 1;
  t.head_dim = 16;
  t.calibration_tokens = 128;
  t.Resize();
  for (int m = 0; m < 4; ++m) {
    for (int i = 0; i < 16; ++i) t.matrix(0, 0, static_cast<Mat>(m))[i * 16 + i] = 1.0f;
  }
  Put(out + "/fuzz_transforms", "identity", SerializeTransforms(t));
  // Snapshot (version 4): 3 sequences of 1 layer, n 64, pages of 96 bytes;
  // the third repeats the second's page, then has one of its own; then the
  // prefix index and a pin.
  {
    const std::string dir = out + "/snapshot_tmp";
    mkdir(dir.c_str(), 0755);
    auto w = SnapshotWriter::Open(dir, "codec=dquant\nlayers=1\n", 96, 4);
    if (!w.ok()) return 1;
    std::vector<uint16_t> wk(2 * 64, 0x3f80), wv(2 * 64, 0xbf80);
    std::vector<uint8_t> page(96, 7);
    for (int s = 0; s < 3; ++s) {
      (void)(*w)->BeginSequence(std::string(s + 1, "abc"[s]), 1);
      (void)(*w)->BeginLayer(3 * 0 + 2 + s * 128, 2, s, wk, wv);
      if (s == 2) (void)(*w)->SharedPage(0);
      for (int i = s == 2 ? 1 : 0; i < s; ++i) (void)(*w)->Page(page.data(), Crc32c(page.data(), page.size()));
    }
    // The index: one entry repeating the first page, one of its own; a pin
    // of both.
    (void)(*w)->BeginIndex(2);
    const std::string ns(16, 'n'), key(16, 'k');
    (void)(*w)->IndexEntry(ns, key, 0);
    (void)(*w)->SharedPage(0);
    (void)(*w)->Digests(std::vector<uint64_t>(16, 0));
    (void)(*w)->IndexEntry(ns, std::string(16, 'j'), 0);
    (void)(*w)->Page(page.data(), Crc32c(page.data(), page.size()));
    (void)(*w)->Digests(std::vector<uint64_t>(16, 0));
    (void)(*w)->BeginPins(1);
    (void)(*w)->Pin("pin", "pin", 1000000000, 2);
    (void)(*w)->SharedPage(0);
    (void)(*w)->SharedPage(2);
    if (!(*w)->Commit().ok()) return 1;
    std::ifstream f(SnapshotPath(dir), std::ios::binary);
    Put(out + "/fuzz_snapshot", "v4_shared_index_pins", std::string(std::istreambuf_iterator<char>(f), {}));
    std::remove(SnapshotPath(dir).c_str());
    rmdir(dir.c_str());
  }
  // Snapshot (version 5): a sequence in the pool, one on the host level
  // (its page's bytes), one on the disk level (keys), one of each of the
  // last two mixed (which a loader drops).
  {
    const std::string dir = out + "/snapshot_tmp";
    mkdir(dir.c_str(), 0755);
    auto w = SnapshotWriter::Open(dir, "codec=dquant\nlayers=1\n", 96);
    if (!w.ok()) return 1;
    std::vector<uint16_t> wk(2 * 64, 0x3f80), wv(2 * 64, 0xbf80);
    std::vector<uint8_t> page(96, 9);
    const uint32_t crc = Crc32c(page.data(), page.size());
    for (int s = 0; s < 4; ++s) {
      (void)(*w)->BeginSequence(std::string(1, "pqrs"[s]), 1);
      (void)(*w)->BeginLayer(2 * 16 + 2, 2, 2, wk, wv);
      for (int i = 0; i < 2; ++i) {
        if (s == 0) (void)(*w)->Page(page.data(), crc);
        if (s == 1 || (s == 3 && i == 0)) (void)(*w)->HostPage(page.data(), crc);
        if (s == 2 || (s == 3 && i == 1)) (void)(*w)->DiskPage(1000 + 2 * s + i, crc);
      }
      (void)(*w)->Digests(std::vector<uint64_t>(2 * 16, 0));
    }
    if (!(*w)->Commit().ok()) return 1;
    std::ifstream f(SnapshotPath(dir), std::ios::binary);
    Put(out + "/fuzz_snapshot", "v5_levels", std::string(std::istreambuf_iterator<char>(f), {}));
    std::remove(SnapshotPath(dir).c_str());
    rmdir(dir.c_str());
  }
  // Disk level segments (tiers/disk_format.h): records of 100-byte pages
  // and a tombstone, sealed by a footer, unsealed, and torn mid-record.
  {
    std::string segment;
    std::vector<tiers::RecordInfo> records;
    for (uint64_t i = 0; i < 3; ++i) {
      tiers::RecordInfo r;
      r.type = i == 2 ? tiers::RecordType::kTombstone : tiers::RecordType::kPage;
      r.key = i == 2 ? 10 : 10 + i;
      r.seq = i + 1;
      r.offset = segment.size();
      const std::string payload =
          r.type == tiers::RecordType::kPage ? std::string(100, static_cast<char>('a' + i)) : "";
      r.payload_bytes = static_cast<uint32_t>(payload.size());
      r.payload_crc = Crc32c(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
      std::string rec(tiers::RecordBytes(payload.size()), '\0');
      tiers::EncodeRecordHeader(r, reinterpret_cast<uint8_t*>(rec.data()));
      rec.replace(tiers::kRecordHeaderBytes, payload.size(), payload);
      segment += rec;
      records.push_back(r);
    }
    Put(out + "/fuzz_disk_records", "unsealed", segment);
    Put(out + "/fuzz_disk_records", "torn", segment.substr(0, segment.size() - 4096 + 40));
    records.pop_back();
    segment.resize(2 * 4096);
    const std::vector<uint8_t> footer = tiers::EncodeFooter(records, segment.size());
    Put(out + "/fuzz_disk_records", "sealed", segment + Bytes(footer));
  }
  // Pool file: the head of the golden pool (header, codec line, first
  // records; the fuzzer's max_len is 16 KiB) and a codec-options line.
  if (argc > 2) {
    std::ifstream golden(argv[2], std::ios::binary);
    std::string head(16384, '\0');
    golden.read(head.data(), head.size());
    head.resize(golden.gcount());
    Put(out + "/fuzz_pool_file", "golden_head", head);
  }
  Put(out + "/fuzz_pool_file", "options",
      "codec=dquant kv_heads=2 head_dim=64 key_levels=8 value_levels=6 key_bytes=0 value_bytes=0 alpha=1.4 "
      "mean_window=128");
  // Config: the sample's essentials.
  Put(out + "/fuzz_config", "small",
      "model { layers: 2 kv_heads: 2 head_dim: 64 }\ncodec { name: \"dquant\" page_tokens: 128 transform: "
      "\"hadamard\" }\nwindow_tokens: 32\npool_bytes: 1048576\nhot_tier_fraction: 0.25\nsnapshot_dir: \"/tmp\"\n"
      "drain_timeout_seconds: 3\nverify_pages_on_attend: true\n");
  // Requests: method byte, then the message (layer 0, 40 tokens of 1 x 64).
  {
    v1::AppendChunk c;
    c.set_sequence_id("s");
    c.set_token_count(40);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(std::string(40 * 64 * 2, '\x3c'));
    c.set_values(std::string(40 * 64 * 2, '\x3b'));
    Put(out + "/fuzz_request", "append", std::string(1, '\0') + c.SerializeAsString());
    v1::AttendRequest a;
    v1::AttendItem* it = a.add_items();
    it->set_sequence_id("s");
    it->set_q_heads(1);
    it->set_dtype(v1::DTYPE_BF16);
    it->set_query(std::string(64 * 2, '\x3c'));
    Put(out + "/fuzz_request", "attend", std::string(1, '\1') + a.SerializeAsString());
    v1::ReadRequest r;
    r.set_sequence_id("s");
    r.set_token_count(40);
    Put(out + "/fuzz_request", "read", std::string(1, '\2') + r.SerializeAsString());
    v1::ReleaseRequest q;
    q.set_sequence_id("s");
    Put(out + "/fuzz_request", "release", std::string(1, '\3') + q.SerializeAsString());
    v1::PrefetchRequest pf;
    pf.set_sequence_id("s");
    Put(out + "/fuzz_request", "prefetch", std::string(1, '\5') + pf.SerializeAsString());
  }
  {
    // Fork requests of sequence "s" (fuzz_fork.cc): the first byte says
    // what follows a fork that was made.
    auto fork = [](const std::string& source, const std::string& id, uint64_t tokens) {
      v1::ForkRequest f;
      f.set_source_sequence_id(source);
      f.set_sequence_id(id);
      f.set_tokens(tokens);
      return f.SerializeAsString();
    };
    Put(out + "/fuzz_fork", "release", std::string(1, '\0') + fork("s", "f", 16));
    Put(out + "/fuzz_fork", "append", std::string(1, '\1') + fork("s", "f", 32));
    Put(out + "/fuzz_fork", "attend", std::string(1, '\2') + fork("s", "f", 16));
    Put(out + "/fuzz_fork", "keep", std::string(1, '\3') + fork("s", "k", 32));
    Put(out + "/fuzz_fork", "partial_page", std::string(1, '\0') + fork("s", "f", 8));
  }
  {
    // Lookup requests (fuzz_lookup.cc): the first byte's bit 0 turns the
    // ids into page keys; "p" holds ids 0..47.
    auto ids = [](int first, int count) {
      v1::LookupRequest l;
      for (int i = first; i < first + count; ++i) l.add_token_ids(i);
      return l.SerializeAsString();
    };
    Put(out + "/fuzz_lookup", "hit", std::string(1, '\0') + ids(0, 48));
    Put(out + "/fuzz_lookup", "hit_keys", std::string(1, '\1') + ids(0, 40));
    Put(out + "/fuzz_lookup", "longer", std::string(1, '\0') + ids(0, 100));
    Put(out + "/fuzz_lookup", "miss", std::string(1, '\0') + ids(1, 32));
    Put(out + "/fuzz_lookup", "short", std::string(1, '\0') + ids(0, 5));
    v1::LookupRequest bad;
    bad.add_page_keys("abc");
    Put(out + "/fuzz_lookup", "bad_key", std::string(1, '\0') + bad.SerializeAsString());
    bad.add_token_ids(3);
    Put(out + "/fuzz_lookup", "both", std::string(1, '\0') + bad.SerializeAsString());
  }
  {
    // Pin requests (fuzz_pin.cc); "q" holds ids 0..47.
    auto pin = [](const std::string& id, int first, int count, uint64_t tokens, double ttl) {
      v1::PinRequest p;
      p.set_pin_id(id);
      for (int i = first; i < first + count; ++i) p.add_prefix_token_ids(i);
      p.set_tokens(tokens);
      p.set_ttl_seconds(ttl);
      return p.SerializeAsString();
    };
    Put(out + "/fuzz_pin", "hit", pin("p", 0, 48, 0, 60));
    Put(out + "/fuzz_pin", "bounded", pin("p", 0, 48, 16, 60));
    Put(out + "/fuzz_pin", "miss", pin("p", 1, 32, 0, 60));
    Put(out + "/fuzz_pin", "no_lease", pin("p", 0, 48, 0, 0));
    Put(out + "/fuzz_pin", "no_id", pin("", 0, 48, 0, 60));
    Put(out + "/fuzz_pin", "odd_tokens", pin("p", 0, 48, 5, 60));
  }
  {
    // WatchPages requests (fuzz_watch_pages.cc): 8 events each.
    auto watch = [](uint32_t batch, uint32_t buffer) {
      v1::WatchPagesRequest w;
      w.set_max_batch(batch);
      w.set_buffer_events(buffer);
      return w.SerializeAsString();
    };
    Put(out + "/fuzz_watch_pages", "defaults", watch(0, 0));
    Put(out + "/fuzz_watch_pages", "one_by_one", watch(1, 0));
    Put(out + "/fuzz_watch_pages", "overflow", watch(3, 2));
    Put(out + "/fuzz_watch_pages", "too_big", watch(5000, 0));
  }
  // An Attend request's wire bytes behind a byte that cuts them into
  // slices (fuzz_attend_request_wire.cc): inline queries, a reference, a
  // step, an unknown field, a query given twice.
  {
    v1::AttendRequest a;
    for (int i = 0; i < 3; ++i) {
      v1::AttendItem* it = a.add_items();
      it->set_sequence_id("s" + std::to_string(i));
      it->set_layer(i);
      it->set_q_heads(2);
      it->set_dtype(v1::DTYPE_BF16);
      if (i != 1) it->set_query(std::string(128 * 2 * 2, static_cast<char>('\x3c' + i)));
    }
    a.mutable_items(1)->mutable_query_ref()->set_region_id(7);
    a.mutable_items(2)->set_new_key(std::string(64, '\x3b'));
    a.mutable_items(2)->set_new_token_index(12);
    const std::string request = a.SerializeAsString();
    Put(out + "/fuzz_attend_request_wire", "one_slice", std::string(1, '\x02') + request);
    Put(out + "/fuzz_attend_request_wire", "small_slices", std::string(1, '\x13') + request);
    // Field 99 (unknown, varint 5) and a second query in the first item.
    v1::AttendRequest b;
    *b.add_items() = a.items(0);
    std::string item = b.items(0).SerializeAsString() + std::string("\x98\x06\x05", 3) + std::string("\x2a\x02zz", 4);
    std::string twice = "\x0a";
    for (size_t n = item.size();; n >>= 7) {
      twice.push_back(static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0)));
      if (n < 0x80) break;
    }
    Put(out + "/fuzz_attend_request_wire", "unknown_and_twice", std::string(1, '\x05') + twice + item);
  }
  // Doorbell memory: two capacity bytes, then the client line, the server
  // line and the request area (fuzz_doorbell.cc).
  {
    v1::AttendRequest a;
    v1::AttendItem* it = a.add_items();
    it->set_sequence_id("s");
    it->set_q_heads(1);
    it->set_dtype(v1::DTYPE_BF16);
    it->set_query(std::string(64 * 2, '\x3c'));
    const std::string request = a.SerializeAsString();
    auto bell = [](uint8_t c_sel, uint8_t r_sel, const std::string& req, uint32_t kind = doorbell::kAttend,
                   uint32_t slot = 0, uint64_t offset = 0) {
      std::string m(2 + doorbell::kHeaderBytes, '\0');
      m[0] = static_cast<char>(c_sel);
      m[1] = static_cast<char>(r_sel);
      doorbell::ClientLine line{};
      line.request_seq = 1;
      line.request_bytes = static_cast<uint32_t>(req.size());
      line.request_word = 1;
      line.kind = kind;
      line.slot = slot;
      line.token_index_offset = offset;
      std::memcpy(&m[2], &line, sizeof(line));
      return m + req;
    };
    Put(out + "/fuzz_doorbell", "attend", bell(3, 7, request));
    Put(out + "/fuzz_doorbell", "response_too_large", bell(3, 0, request));
    Put(out + "/fuzz_doorbell", "garbage", bell(0, 0, std::string(16, '\xff')));
    // Prepared requests (wire/doorbell.h): one by reference with a decode
    // step kept in slot 2, then answered with its token index advanced.
    v1::AttendRequest p;
    v1::AttendItem* pi = p.add_items();
    pi->set_sequence_id("s");
    pi->set_q_heads(1);
    pi->mutable_query_ref()->set_region_id(1);
    pi->mutable_new_key_ref()->set_region_id(1);
    pi->mutable_new_value_ref()->set_region_id(1);
    pi->set_new_token_index(3);
    Put(out + "/fuzz_doorbell", "prepare", bell(3, 7, p.SerializeAsString(), doorbell::kPrepare, 2));
    Put(out + "/fuzz_doorbell", "attend_prepared", bell(3, 7, "", doorbell::kAttendPrepared, 2, 5));
    // AttendStream frames: [flags][length][request] records (fuzz_attend_frame.cc).
    auto frame = [](uint8_t flags, const std::string& req) {
      return std::string(1, static_cast<char>(flags)) + std::string(1, static_cast<char>(req.size())) + req;
    };
    Put(out + "/fuzz_attend_frame", "frames_and_cancel",
        "\xff" + frame(1, request) + frame(2 | 0x20, request) + frame(2 | 8, "") + frame(3, request));
    Put(out + "/fuzz_attend_frame", "client_goes_away", "\x01" + frame(1, request) + frame(2, request));
    Put(out + "/fuzz_attend_frame", "timeouts", "\xff" + frame(1 | 0x10, request) + frame(2 | 0x30, request));
  }
  return 0;
}
