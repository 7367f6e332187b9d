// The checksum of one stored page: CRC-32C (Castagnoli, reflected
// polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF, the iSCSI
// / ext4 / LevelDB CRC) of the page's bytes as they sit in the cold pool,
// page_stride() bytes from PagePool::page(p).
//
// WHAT IT COVERS. The cold page (a D-Quant page, codec/page_layout.h) is the
// canonical form of a page: the handler computes the checksum when the page
// is encoded, from the bytes the backend holds (Backend::ChecksumPages: on
// cuda the device's copy), and keeps it host-side beside the page id (never
// inside the arena, so a corrupted arena cannot also corrupt its own
// checksum). A hot page (a level page, codec/level_page.h) is a byte-exact
// promotion of a cold page, checked before it is promoted; the checksum of
// its level form is recorded at promotion and checked while it stays hot
// (Read, Attend with verify_pages_on_attend) and before it is demoted, whose
// result must match the cold checksum again. The snapshot file stores each
// page in cold form with this checksum (service/snapshot_file.h). The bf16
// windows carry the same CRC per token (service/page_verifier.h,
// WindowTokenSum).
//
// The CRC itself is wire/crc32c.h's, the one Append chunks carry (SSE4.2,
// 8 bytes per instruction; docs/reliability.md has the measured speed).
#ifndef DRIFTKV_BACKENDS_PAGE_CHECKSUM_H_
#define DRIFTKV_BACKENDS_PAGE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "wire/crc32c.h"

namespace driftkv {

// CRC-32C of `size` bytes, continuing from `crc` (the CRC of the bytes
// before; 0 for none): Crc32c(a + b) == Crc32c(b, Crc32c(a)).
inline uint32_t Crc32c(const uint8_t* data, size_t size, uint32_t crc = 0) {
  return Crc32cExtend(crc, data, size);
}

using PageChecksum = uint32_t;

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_PAGE_CHECKSUM_H_
