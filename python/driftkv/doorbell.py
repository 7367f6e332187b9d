"""driftkv.doorbell.Doorbell: Attend through a doorbell in a HostRegion
(wire/doorbell.h has the layout and the protocol; client/doorbell.h is the
C++ twin), for a client on the server's host: the request and the answer
cross shared memory, no socket.

Views of the two header lines (little-endian, at the doorbell's offset):
  client line  u64[0] request_seq, u32[2] request_bytes, u32[3]
               request_word (the server's futex word), i64[2] deadline_ns,
               u32[6] kind, u32[7] slot, u64[4] token_index_offset
  server line  u64[8] response_seq, i32[18] code, u32[19] response_bytes,
               u32[20] response_word, u32[21] server_sleeping
then the request area (request_capacity bytes) and the response area.

Ordering: this client writes the request bytes, request_bytes and
deadline_ns, then request_seq, then request_word, each a plain aligned
store in program order; x86-64 keeps stores in order (TSO), which is why
the doorbell refuses other machines. Python has no full fence, so the
check of server_sleeping after request_word may see a stale 0 while the
server goes to sleep: the wait loop therefore wakes a sleeping server
again whenever it sees server_sleeping set with the answer still missing
(the server rechecks request_seq when woken). Not thread-safe: one request
at a time per doorbell.
"""
import ctypes
import platform
import time
from typing import Optional

import grpc
import numpy as np

from driftkv import _validate as V
from driftkv._errors import DriftkvError, invalid
from driftkv._proto import pb
from driftkv.attend_stream import status_code

HEADER_BYTES = 128
ALIGNMENT = 64
MAX_AREA_BYTES = 64 << 20
DEFAULT_CAPACITY = 1 << 20
_SYS_FUTEX = {"x86_64": 202}
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_INT_MAX = 0x7FFFFFFF
SPIN_SECONDS = 20e-6    # spin this long after ringing, then wait on the futex
WAIT_SECONDS = 0.05     # each futex wait's timeout (then the loop checks again)
# A request with a deadline is answered by the server (DEADLINE_EXCEEDED
# at worst); this long past it the server is not answering at all.
GRACE_SECONDS = 1.0
# Kinds of request (wire/doorbell.h) and the prepared slots' limit.
KIND_ATTEND = 0
KIND_PREPARE = 1
KIND_ATTEND_PREPARED = 2
MAX_PREPARED_SLOTS = 1024


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def doorbell_bytes(request_capacity: int, response_capacity: int) -> int:
    """Bytes a doorbell of these capacities spans in its region."""
    return HEADER_BYTES + request_capacity + response_capacity


class Doorbell:
    """Made by Client.open_doorbell(region, ...). attend() as
    AttendStream.attend; close() stops the server's watcher."""

    def __init__(self, client, region, offset: Optional[int] = None, request_capacity: int = DEFAULT_CAPACITY,
                 response_capacity: int = DEFAULT_CAPACITY):
        machine = platform.machine()
        if machine not in _SYS_FUTEX:
            raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"the Python doorbell needs x86-64's store order; this machine is {machine}")
        for name, c in (("request_capacity", request_capacity), ("response_capacity", response_capacity)):
            if c <= 0 or c % ALIGNMENT or c > MAX_AREA_BYTES:
                raise invalid(f"{name} {c} must be a positive multiple of {ALIGNMENT}, at most {MAX_AREA_BYTES}")
        total = doorbell_bytes(request_capacity, response_capacity)
        if offset is None:
            area = region.alloc((total,), np.uint8, align=ALIGNMENT)
            offset = region.offset_of(area.__array_interface__["data"][0], total)
        else:
            area = region.ndarray(offset, (total,), np.uint8)
        self._client = client
        self._request_capacity = request_capacity
        self._area = area
        self._u64 = area[:HEADER_BYTES].view("<u8")
        self._i64 = area[:HEADER_BYTES].view("<i8")
        self._u32 = area[:HEADER_BYTES].view("<u4")
        self._i32 = area[:HEADER_BYTES].view("<i4")
        self._request = area[HEADER_BYTES:HEADER_BYTES + request_capacity]
        self._response = area[HEADER_BYTES + request_capacity:]
        self._request_word = area.__array_interface__["data"][0] + 12
        self._response_word = area.__array_interface__["data"][0] + 80
        self._wait_timeout = _Timespec(0, int(WAIT_SECONDS * 1e9))
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._sys_futex = _SYS_FUTEX[machine]
        area[:HEADER_BYTES] = 0
        self._seq = 0
        self._prepared = {}  # slot -> finish of the request prepared there
        self._broken = False
        self._closed = False
        stub = client._connect()
        req = pb.OpenDoorbellRequest(region_id=region.id, offset=offset, request_capacity=request_capacity,
                                     response_capacity=response_capacity)
        self.id: int = client._call(False, lambda t: stub.OpenDoorbell(req, timeout=t)).doorbell_id
        self._region = region  # outlives the doorbell

    def _wake_server(self) -> None:
        self._libc.syscall(ctypes.c_long(self._sys_futex), ctypes.c_void_p(self._request_word),
                           ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(_INT_MAX), None, None, ctypes.c_int(0))

    def _wait_answer(self, word: int) -> None:
        """Sleeps on response_word while it still holds `word` (the low 32
        bits of the previous answer's seq), at most WAIT_SECONDS. The server
        stores response_word after response_seq, then wakes this word; a
        store that comes first makes the wait return at once (EAGAIN)."""
        self._libc.syscall(ctypes.c_long(self._sys_futex), ctypes.c_void_p(self._response_word),
                           ctypes.c_int(_FUTEX_WAIT), ctypes.c_uint(word), ctypes.byref(self._wait_timeout), None,
                           ctypes.c_int(0))

    def attend(self, request_or_items, *, timeout: Optional[float] = None, **kwargs):
        """Client.attend through the doorbell (items, or a pb.AttendRequest
        for a pb.AttendResponse). `timeout` (default: the client's) is the
        request's deadline on the server and bounds the wait here: no
        answer GRACE_SECONDS past it breaks the doorbell (open another), so
        does KeyboardInterrupt while waiting (the server may still be
        reading the request; the next one would overwrite it). Everything
        is checked before the request is written."""
        V.timeout(timeout)
        req, _, finish = self._client.prepare_attend(request_or_items, **kwargs)
        return finish(self._call(KIND_ATTEND, 0, 0, req.SerializeToString(), timeout))

    def prepare(self, slot: int, request_or_items, **kwargs) -> None:
        """Keeps the request attend(request_or_items, **kwargs) would send
        in `slot` on the server (wire/doorbell.h, PREPARED REQUESTS), for
        attend_prepared to answer again and again without sending it. Every
        tensor must be by reference (arrays in registered regions, out= too):
        the server refuses inline ones. A decode loop prepares one request
        per layer, writes each step's queries (and new keys and values) into
        the same arrays, and calls attend_prepared(layer, steps_taken)."""
        self._check_slot(slot)
        timeout = kwargs.pop("timeout", None)
        V.timeout(timeout)
        req, _, finish = self._client.prepare_attend(request_or_items, **kwargs)
        self._call(KIND_PREPARE, slot, 0, req.SerializeToString(), timeout)
        self._prepared[slot] = finish

    def attend_prepared(self, slot: int, token_index_offset: int = 0, *, timeout: Optional[float] = None):
        """What attend returned for the request prepared in `slot`, answered
        now (the tensors read from their regions at this call), each
        new_token_index it set advanced by `token_index_offset`."""
        self._check_slot(slot)
        V.timeout(timeout)
        if not 0 <= token_index_offset < 1 << 64:
            raise invalid(f"token_index_offset {token_index_offset} must be in [0, 2^64)")
        finish = self._prepared.get(slot)
        response = self._call(KIND_ATTEND_PREPARED, slot, token_index_offset, b"", timeout)
        return finish(response) if finish is not None else response

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < MAX_PREPARED_SLOTS:
            raise invalid(f"slot {slot} must be in [0, {MAX_PREPARED_SLOTS})")

    def _call(self, kind: int, slot: int, offset: int, data: bytes, timeout: Optional[float]):
        """Writes a request of `kind` and waits for its answer: a parsed
        pb.AttendResponse (None for KIND_PREPARE)."""
        if len(data) > self._request_capacity:
            raise invalid(f"request of {len(data)} bytes exceeds the doorbell's capacity {self._request_capacity}")
        if self._broken or self._closed:
            raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION,
                               "the doorbell was closed, timed out or interrupted; open another")
        timeout = self._client.timeout if timeout is None else timeout
        start = time.monotonic_ns()  # CLOCK_MONOTONIC, the server's clock
        deadline = start + int(timeout * 1e9)
        if data:
            self._request[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        self._seq += 1
        seq = self._seq
        self._u32[2] = len(data)
        self._i64[2] = deadline
        self._u32[6] = kind
        self._u32[7] = slot
        self._u64[4] = offset
        self._u64[0] = seq
        self._u32[3] = seq & 0xFFFFFFFF
        if self._u32[21]:
            self._wake_server()
        try:
            self._wait(seq, start, deadline, timeout)
        except BaseException:  # KeyboardInterrupt included
            self._broken = True
            raise
        code = int(self._i32[18])
        size = min(int(self._u32[19]), len(self._response))
        answer = self._response[:size].tobytes()
        if code != 0:
            raise DriftkvError(status_code(code), answer.decode("utf-8", "replace"))
        if kind == KIND_PREPARE:
            return None
        response = pb.AttendResponse()
        try:
            response.ParseFromString(answer)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError, by any backend
            raise DriftkvError(grpc.StatusCode.DATA_LOSS,
                               f"doorbell answer of {size} bytes is not an AttendResponse") from None
        return response

    def _wait(self, seq: int, start: int, deadline: int, timeout: float) -> None:
        # A short spin, then sleep on response_word: spinning through the
        # whole call would take a core from the server's attention (on a
        # 2-core host, half of it).
        spin_until = start + int(SPIN_SECONDS * 1e9)
        previous = (seq - 1) & 0xFFFFFFFF
        while int(self._u64[8]) != seq:
            now = time.monotonic_ns()
            if now > deadline + int(GRACE_SECONDS * 1e9):
                raise DriftkvError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"no answer through doorbell {self.id} within {timeout} s and {GRACE_SECONDS} s")
            if now < spin_until:
                continue
            if self._u32[21] and int(self._u64[8]) != seq:
                self._wake_server()
            self._wait_answer(previous)

    def close(self) -> None:
        """Stops the server's watcher; nothing when closed already or when
        the client was closed (its regions, the doorbell's among them, are
        unregistered then)."""
        if self._closed:
            return
        self._closed = True
        if self._client.closed:
            return
        stub = self._client._connect()
        req = pb.CloseDoorbellRequest(doorbell_id=self.id)
        self._client._call(False, lambda t: stub.CloseDoorbell(req, timeout=t))

    def __enter__(self) -> "Doorbell":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
