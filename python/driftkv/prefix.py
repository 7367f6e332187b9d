"""Page keys: the names the server's prefix index gives full pages, from
token ids alone (docs/prefix_cache.md, "Page keys"), so that a router can
compute them without the server.

With P = page_tokens (Info) and token ids t_0, t_1, ... (uint32):

    ROOT = SHA-256(b"driftkv page key v1")[:16]
    K_k  = SHA-256(K_{k-1} + le32(t_kP) + ... + le32(t_kP+P-1))[:16]   (K_-1 = ROOT)

A key names its page and, through the chain, every token before it. The
server qualifies keys by tenant and codec on its side; a router never sees
that namespace. This is the reference implementation; the server's is
service/page_key.cc, and both are tested against the same vectors.
"""
import hashlib
from typing import Iterable, List, Sequence

import numpy as np

from driftkv._errors import invalid

KEY_BYTES = 16
ROOT = hashlib.sha256(b"driftkv page key v1").digest()[:KEY_BYTES]


def next_page_key(parent: bytes, page_ids: Sequence[int]) -> bytes:
    """K_k from K_{k-1} (`parent`, 16 bytes) and page k's P token ids."""
    if len(parent) != KEY_BYTES:
        raise invalid(f"parent has {len(parent)} bytes; a page key has {KEY_BYTES}")
    return hashlib.sha256(parent + _le32(page_ids, "page_ids")).digest()[:KEY_BYTES]


def page_keys(token_ids: Iterable[int], page_tokens: int) -> List[bytes]:
    """The keys of the full pages of `token_ids` (len // page_tokens of
    them), page 0 first; a trailing partial page has none."""
    if not isinstance(page_tokens, int) or isinstance(page_tokens, bool) or page_tokens < 1:
        raise invalid(f"page_tokens is {page_tokens!r}; expected an int >= 1")
    le = _le32(token_ids, "token_ids")
    step = 4 * page_tokens
    keys: List[bytes] = []
    parent = ROOT
    for at in range(0, len(le) - step + 1, step):
        parent = hashlib.sha256(parent + le[at:at + step]).digest()[:KEY_BYTES]
        keys.append(parent)
    return keys


def _le32(ids: Iterable[int], name: str) -> bytes:
    """ids as little-endian uint32 bytes; each must fit."""
    a = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
    if a.size == 0:
        return b""
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise invalid(f"{name} must be a flat sequence of integers")
    if int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF:
        raise invalid(f"{name} holds a value outside [0, 2**32): token ids are uint32")
    return a.astype("<u4").tobytes()
