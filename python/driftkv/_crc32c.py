"""CRC-32C (Castagnoli) of Append chunks: AppendChunk.crc32c covers the
bytes of keys followed by the bytes of values (proto/driftkv.proto).

Uses the `google_crc32c` or `crc32c` package when one is installed (both
hardware-accelerated), else numpy: the buffer is cut into equal lanes whose
CRCs run side by side, then merged pairwise with the linear map "append L
zero bytes" (CRC is linear over GF(2)), about 20 ms per MiB.
"""
from typing import List

import numpy as np

_POLY = 0x82F63B78  # 0x1EDC6F41 bit-reversed


def _make_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(_POLY), t >> 1).astype(np.uint32)
    return t


_TABLE = _make_table()
_TABLE_LIST: List[int] = [int(x) for x in _TABLE]


def _python_extend(crc: int, data: bytes) -> int:
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _TABLE_LIST[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _zeros_tables(images: np.ndarray) -> np.ndarray:
    """Byte tables [4][256] of the linear map whose images of the 32 basis
    bits are `images`."""
    v = np.arange(256, dtype=np.uint32)
    out = np.zeros((4, 256), dtype=np.uint32)
    for j in range(4):
        for b in range(8):
            out[j] ^= np.where((v >> b) & 1, images[8 * j + b], 0).astype(np.uint32)
    return out


def _apply(tables: np.ndarray, c: np.ndarray) -> np.ndarray:
    return (tables[0][c & 0xFF] ^ tables[1][(c >> 8) & 0xFF] ^ tables[2][(c >> 16) & 0xFF] ^
            tables[3][c >> 24])


def _numpy_raw(data: np.ndarray) -> int:
    """CRC register (start 0, no final XOR) after `data` (uint8)."""
    n = data.size
    lane = 1 << max(6, (int(np.sqrt(n)) - 1).bit_length())  # power of two near sqrt(n)
    lanes = -(-n // lane)
    lanes = 1 << (lanes - 1).bit_length()                    # power of two, for the pairwise merge
    padded = np.zeros(lanes * lane, dtype=np.uint8)
    padded[lanes * lane - n:] = data                         # leading zeros leave a zero register unchanged
    cols = np.ascontiguousarray(padded.reshape(lanes, lane).T)
    c = np.zeros(lanes, dtype=np.uint32)
    for row in cols:
        c = _TABLE[(c ^ row) & 0xFF] ^ (c >> 8)
    # The map "append `lane` zero bytes", from its basis images.
    basis = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)
    img = basis.copy()
    for _ in range(lane):
        img = _TABLE[img & 0xFF] ^ (img >> 8)
    tables = _zeros_tables(img)
    while c.size > 1:
        c = _apply(tables, c[0::2]) ^ c[1::2]
        img = _apply(tables, _apply(tables, basis))  # twice the length: the map squared
        tables = _zeros_tables(img)
    return int(c[0])


def _numpy_extend(crc: int, data: bytes) -> int:
    if len(data) < 64:
        return _python_extend(crc, data)
    arr = np.frombuffer(data, dtype=np.uint8).copy()
    # Starting the register at S equals starting at 0 with S XORed into the
    # first four bytes (reflected CRC, 32-bit register).
    start = (crc ^ 0xFFFFFFFF).to_bytes(4, "little")
    arr[:4] ^= np.frombuffer(start, dtype=np.uint8)
    return _numpy_raw(arr) ^ 0xFFFFFFFF


def _pick():
    try:
        import google_crc32c  # type: ignore
        return lambda crc, data: google_crc32c.extend(crc, data)
    except ImportError:
        pass
    try:
        import crc32c as _c  # type: ignore
        return lambda crc, data: _c.crc32c(data, crc)
    except ImportError:
        pass
    return _numpy_extend


_extend = _pick()


def crc32c_extend(crc: int, data: bytes) -> int:
    """CRC-32C of (earlier bytes whose CRC-32C is `crc`) + data."""
    return _extend(crc, data)


def crc32c(data: bytes) -> int:
    return _extend(0, data)
