// CRC-32C (Castagnoli): polynomial 0x1EDC6F41 (0x82F63B78 bit-reversed),
// reflected, initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF; the checksum of
// iSCSI (RFC 3720), ext4 and gRPC's own tooling. Crc32c("123456789") =
// 0xE3069283. AppendChunk.crc32c carries it over keys then values.
#ifndef DRIFTKV_WIRE_CRC32C_H_
#define DRIFTKV_WIRE_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace driftkv {

// Extends `crc` (a finished checksum of earlier bytes, 0 for none) over
// `size` more bytes: Crc32c(a + b) = Crc32cExtend(Crc32c(a), b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(absl::string_view bytes) {
  return Crc32cExtend(0, bytes.data(), bytes.size());
}

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_CRC32C_H_
