#include "codec/transform/transforms_file.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"

namespace driftkv {
namespace {

// Explicit little-endian packing, independent of the host's byte order.
void Put(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t Get(const std::string& in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

uint64_t Fnv1a64(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(p[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

size_t PayloadBytes(uint64_t l, uint64_t h, uint64_t d) {
  return 16 * l * h * d * d;
}

}  // namespace

std::string SerializeTransforms(const TransformSet& s) {
  std::string out(kTransformsMagic, sizeof(kTransformsMagic));
  Put(&out, kTransformsVersion, 4);
  Put(&out, s.layers, 4);
  Put(&out, s.kv_heads, 4);
  Put(&out, s.head_dim, 4);
  Put(&out, s.flags, 4);
  Put(&out, s.key_center_window, 4);
  uint64_t g;
  std::memcpy(&g, &s.gamma, 8);
  Put(&out, g, 8);
  Put(&out, s.calibration_tokens, 8);
  out.reserve(out.size() + 4 * s.data.size() + 8);
  for (float f : s.data) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    Put(&out, u, 4);
  }
  Put(&out, Fnv1a64(out.data(), out.size()), 8);
  return out;
}

uint64_t TransformsChecksum(const TransformSet& set) {
  const std::string bytes = SerializeTransforms(set);
  return Get(bytes, bytes.size() - 8, 8);
}

absl::StatusOr<TransformSet> ParseTransforms(const std::string& in) {
  if (in.size() < kTransformsHeaderBytes + 8) {
    return absl::DataLossError(absl::StrCat("transforms file is ", in.size(), " bytes, shorter than its header"));
  }
  if (std::memcmp(in.data(), kTransformsMagic, 8) != 0) {
    return absl::DataLossError("not a transforms file (bad magic)");
  }
  const uint32_t version = static_cast<uint32_t>(Get(in, 8, 4));
  if (version != kTransformsVersion) {
    return absl::DataLossError(
        absl::StrCat("transforms file version ", version, ", this build reads ", kTransformsVersion));
  }
  const uint64_t l = Get(in, 12, 4), h = Get(in, 16, 4), d = Get(in, 20, 4);
  if (l == 0 || h == 0 || d == 0 || l > 4096 || h > 4096 || d > 4096 || !IsPowerOfTwo(static_cast<int>(d))) {
    return absl::DataLossError(absl::StrCat("transforms file shape ", l, " x ", h, " x ", d, " is invalid"));
  }
  const size_t expect = kTransformsHeaderBytes + PayloadBytes(l, h, d) + 8;
  if (in.size() != expect) {
    return absl::DataLossError(absl::StrCat("transforms file is ", in.size(), " bytes; its header (", l, " layers, ", h,
                                            " heads, head_dim ", d, ") needs ", expect));
  }
  if (Fnv1a64(in.data(), in.size() - 8) != Get(in, in.size() - 8, 8)) {
    return absl::DataLossError("transforms file checksum mismatch (corrupt or truncated)");
  }
  TransformSet s;
  s.layers = static_cast<int>(l);
  s.kv_heads = static_cast<int>(h);
  s.head_dim = static_cast<int>(d);
  s.flags = static_cast<uint32_t>(Get(in, 24, 4));
  s.key_center_window = static_cast<uint32_t>(Get(in, 28, 4));
  const uint64_t g = Get(in, 32, 8);
  std::memcpy(&s.gamma, &g, 8);
  s.calibration_tokens = Get(in, 40, 8);
  s.Resize();
  for (size_t i = 0; i < s.data.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(Get(in, kTransformsHeaderBytes + 4 * i, 4));
    std::memcpy(&s.data[i], &u, 4);
  }
  return s;
}

absl::Status WriteTransformsFile(const std::string& path, const TransformSet& set) {
  const std::string bytes = SerializeTransforms(set);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  f.write(bytes.data(), bytes.size());
  if (!f) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<TransformSet> ReadTransformsFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open transforms file ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  absl::StatusOr<TransformSet> s = ParseTransforms(ss.str());
  if (!s.ok()) return absl::DataLossError(absl::StrCat(path, ": ", s.status().message()));
  return s;
}

}  // namespace driftkv
