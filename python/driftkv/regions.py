"""Memory regions (docs/api.md, "Memory regions"; docs/python.md): memory
registered once with the server, that requests then name by (region_id,
offset) instead of carrying bytes.

HostRegion: host shared memory. A memfd of the asked size (zeros), sealed
against shrinking (the server maps it; a file that shrank under the mapping
would fault the server), mapped here, handed to the server's region socket
over SCM_RIGHTS, and registered with the one-time attach token the socket
answers. A daemon thread renews the lease every third of it; close()
unregisters. If this process dies, the server drops the region once its
lease has run out.

CudaRegions: device memory of torch CUDA tensors, registered by the CUDA IPC
handle of their allocation (one registration per base allocation of the
caching allocator, cached).
"""
import asyncio
import ctypes
import fcntl
import mmap
import os
import socket
import struct
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from driftkv._errors import DriftkvError
from driftkv._proto import pb

import grpc

ATTACH_MAGIC = b"DKVRGN01"  # wire/fd_socket.h
TOKEN_BYTES = 16
MAX_REPLY_BYTES = 1 + 512


def _attach(socket_path: str, fd: int, timeout: float) -> Tuple[bytes, int]:
    """Sends `fd` to the region socket; returns (attach token, size)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(socket_path)
        except OSError as e:
            raise DriftkvError(grpc.StatusCode.UNAVAILABLE, f"region socket {socket_path}: {e}") from None
        socket.send_fds(s, [ATTACH_MAGIC], [fd])
        reply = b""
        while len(reply) <= MAX_REPLY_BYTES:
            part = s.recv(MAX_REPLY_BYTES + 1)
            if not part:
                break
            reply += part
    if reply[:1] == b"\0" and len(reply) == 1 + TOKEN_BYTES + 8:
        return reply[1:1 + TOKEN_BYTES], struct.unpack("<Q", reply[1 + TOKEN_BYTES:])[0]
    if reply[:1] == b"\1":
        raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION,
                           "region socket refused: " + reply[1:].decode("utf-8", "replace"))
    raise DriftkvError(grpc.StatusCode.UNAVAILABLE, f"region socket {socket_path}: malformed reply of {len(reply)} bytes")


def sealed_memfd(name: str, nbytes: int) -> int:
    """A memfd of `nbytes` zeros sealed with F_SEAL_SHRINK | F_SEAL_SEAL."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Renewer:
    """Renews a set of region ids every third of `lease` seconds."""

    def __init__(self, client, lease: float):
        self._client = client
        self._ids = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(max(lease / 3.0, 0.1),), daemon=True,
                                        name="driftkv-region-renew")
        self._thread.start()

    def add(self, region_id: int):
        with self._lock:
            self._ids.add(region_id)

    def discard(self, region_id: int):
        with self._lock:
            self._ids.discard(region_id)

    def _run(self, period: float):
        while not self._stop.wait(period):
            with self._lock:
                ids = list(self._ids)
            if ids:
                try:
                    renew_regions(self._client, ids)
                except DriftkvError:
                    pass  # the next round tries again; the lease covers two misses

    def stop(self):
        self._stop.set()
        self._thread.join()


def _stub(client):
    return client._connect()


def register_region(client, request) -> "pb.RegisterRegionResponse":
    stub = _stub(client)
    return client._call(False, lambda t: stub.RegisterRegion(request, timeout=t))


def unregister_region(client, region_id: int) -> None:
    stub = _stub(client)
    client._call(False, lambda t: stub.UnregisterRegion(pb.UnregisterRegionRequest(region_id=region_id),
                                                        timeout=t))


def renew_regions(client, region_ids=()) -> "pb.RenewRegionsResponse":
    """Renews the leases of `region_ids` (empty: every region of the tenant)."""
    stub = _stub(client)
    req = pb.RenewRegionsRequest(region_ids=list(region_ids))
    return client._call(True, lambda t: stub.RenewRegions(req, timeout=t))


class HostRegion:
    """A registered host shared-memory region of `size` bytes.

    region.ndarray(offset, shape, dtype) is a numpy view of its memory (the
    server sees the same pages); region.alloc(shape, dtype) the next free
    such view (a bump allocator, 64-byte aligned; never freed);
    region.ref(offset) the TensorRef for a request's *_ref field. Client
    calls find arrays inside the region by address (offset_of) and send
    them by reference. close() (or the with block's end) unregisters and
    unmaps; views must not be used after that.
    """

    def __init__(self, client, nbytes: int, *, lease_seconds: int = 0, name: str = "",
                 socket_path: Optional[str] = None, renew: bool = True, socket_timeout: float = 5.0):
        if nbytes <= 0:
            raise DriftkvError(grpc.StatusCode.INVALID_ARGUMENT, f"nbytes {nbytes} must be > 0")
        self._client = client
        if socket_path is None:
            stub = _stub(client)
            socket_path = client._call(True, lambda t: stub.Info(pb.InfoRequest(), timeout=t)).region_socket
            if not socket_path:
                raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "the server has no region socket (config region_socket)")
        fd = sealed_memfd(name or "driftkv-region", nbytes)
        try:
            self._map = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            token, size = _attach(socket_path, fd, socket_timeout)
        finally:
            os.close(fd)  # both mappings keep the memory
        try:
            r = register_region(client, pb.RegisterRegionRequest(kind=pb.REGION_HOST_SHM, attach_token=token,
                                                                 lease_seconds=lease_seconds, name=name))
        except BaseException:
            self._map.close()
            raise
        self.id: int = r.region_id
        self.size: int = r.size
        self.lease_seconds: int = r.lease_seconds
        self._renewer = _Renewer(client, self.lease_seconds) if renew and self.lease_seconds > 0 else None
        if self._renewer:
            self._renewer.add(self.id)
        self._closed = False
        # The mapping's address; a temporary export, released at once (the
        # address stays valid while the mapping is open).
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._next = 0
        self._alloc_lock = threading.Lock()

    def offset_of(self, address: int, nbytes: int) -> Optional[int]:
        """The offset of [address, address + nbytes) when it lies inside the
        open region, else None."""
        if self._closed or address < self._base or address + nbytes > self._base + self.size:
            return None
        return address - self._base

    def alloc(self, shape, dtype, align: int = 64) -> np.ndarray:
        """A view of the next `shape` x `dtype` bytes not handed out yet,
        its offset a multiple of `align`; RESOURCE_EXHAUSTED when they do
        not fit."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape)) if shape != () else 1
        with self._alloc_lock:
            offset = -(-self._next // align) * align
            if offset + count * dtype.itemsize > self.size:
                raise DriftkvError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"{count * dtype.itemsize} bytes do not fit region {self.id} past offset "
                                   f"{offset} ({self.size} bytes)")
            self._next = offset + count * dtype.itemsize
        return self.ndarray(offset, shape, dtype)

    def ndarray(self, offset: int, shape, dtype) -> np.ndarray:
        """A numpy view of [offset, offset + nbytes) of the region."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape)) if shape != () else 1
        if offset < 0 or offset + count * dtype.itemsize > self.size:
            raise DriftkvError(grpc.StatusCode.OUT_OF_RANGE,
                               f"offset {offset} + {count * dtype.itemsize} bytes is past the end of region "
                               f"{self.id} ({self.size} bytes)")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)

    def ref(self, offset: int = 0) -> "pb.TensorRef":
        return pb.TensorRef(region_id=self.id, offset=offset)

    def renew(self) -> None:
        """Renews the lease now; NOT_FOUND when the server no longer has the region."""
        r = renew_regions(self._client, [self.id])
        if self.id in r.unknown_region_ids:
            raise DriftkvError(grpc.StatusCode.NOT_FOUND, f"region_id {self.id} not found")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._renewer:
            self._renewer.stop()
        try:
            unregister_region(self._client, self.id)
        finally:
            try:
                self._map.close()
            except BufferError:
                pass  # numpy views still exist: the mapping goes with the last of them

    def __enter__(self) -> "HostRegion":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def aclose(self) -> None:
        """close() from an event loop: its UnregisterRegion runs in a thread."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> "HostRegion":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def _ipc_handle(shareable: bytes) -> bytes:
    """The cudaIpcMemHandle_t inside torch's shareable handle of a block:
    older torch gives the 64 bytes alone; newer torch puts a format-version
    byte and a kind byte before them (kind 'c': a cudaMalloc block). A block
    of an expandable segment (kind 'e') has no cudaIpcMemHandle_t."""
    if len(shareable) == _IPC_HANDLE_BYTES:
        return shareable
    if len(shareable) == _IPC_HANDLE_BYTES + 2 and shareable[1] == ord("c"):
        return shareable[2:]
    if len(shareable) >= 2 and shareable[1] == ord("e"):
        raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION,
                           "the tensor lives in an expandable segment (PYTORCH_CUDA_ALLOC_CONF "
                           "expandable_segments:True), which has no CUDA IPC handle; allocate it without "
                           "expandable segments or pass it inline")
    raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION,
                       f"torch's shareable handle of {len(shareable)} bytes is not one this client knows")


class CudaRegions:
    """Registers the allocations of torch CUDA tensors by CUDA IPC, once per
    base allocation of torch's caching allocator (a later tensor of the same
    block reuses the registration; one past the registered size re-registers
    the block larger). ref(tensor) is the TensorRef of the tensor's first
    byte. close() unregisters everything."""

    def __init__(self, client, *, lease_seconds: int = 0, renew: bool = True):
        self._client = client
        self._lease = lease_seconds
        self._renew = renew
        self._lock = threading.Lock()
        self._by_handle: Dict[bytes, Tuple[int, int]] = {}  # handle -> (region_id, size)
        self._renewer: Optional[_Renewer] = None

    @staticmethod
    def _where(tensor) -> Tuple[bytes, int, int, int]:
        """(IPC handle of the tensor's allocation, its device, the offset of
        the tensor's first byte from the allocation's base, the bytes a
        registration must span to hold the tensor's storage)."""
        if not tensor.is_cuda or not tensor.is_contiguous():
            raise DriftkvError(grpc.StatusCode.INVALID_ARGUMENT, "a contiguous CUDA tensor is required")
        # torch >= 2.0 has untyped_storage(); 1.13 storage().untyped().
        # Either's _share_cuda_() is (device, handle, storage bytes, offset
        # of the storage in the allocation's block in bytes, ref counter
        # handle and offset, event handle, event sync required), as
        # torch.multiprocessing.reductions.reduce_tensor unpacks it.
        storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage().untyped()
        shared = storage._share_cuda_()
        device, handle, storage_bytes, storage_offset = shared[0], _ipc_handle(bytes(shared[1])), shared[2], shared[3]
        offset = storage_offset + tensor.storage_offset() * tensor.element_size()
        return handle, device, offset, storage_offset + storage_bytes

    def lookup(self, tensor) -> Optional["pb.TensorRef"]:
        """The TensorRef of the tensor when its allocation is registered
        already (large enough), else None; never calls the server. Reads
        without the lock (a dict lookup is atomic), so that a registration
        in progress, which holds the lock through its RPC, does not stall
        an event loop."""
        handle, _, offset, need = self._where(tensor)
        known = self._by_handle.get(handle)
        if known is None or known[1] < need:
            return None
        return pb.TensorRef(region_id=known[0], offset=offset)

    def ref(self, tensor) -> "pb.TensorRef":
        handle, device, offset, need = self._where(tensor)
        with self._lock:
            known = self._by_handle.get(handle)
            if known is None or known[1] < need:
                if known is not None:
                    unregister_region(self._client, known[0])
                r = register_region(self._client, pb.RegisterRegionRequest(
                    kind=pb.REGION_CUDA_IPC, cuda_ipc_handle=handle, device=device, size=need,
                    lease_seconds=self._lease, name=f"cuda:{device}"))
                if self._renew and self._renewer is None and r.lease_seconds > 0:
                    self._renewer = _Renewer(self._client, r.lease_seconds)
                if self._renewer:
                    if known is not None:
                        self._renewer.discard(known[0])
                    self._renewer.add(r.region_id)
                known = (r.region_id, need)
                self._by_handle[handle] = known
        return pb.TensorRef(region_id=known[0], offset=offset)

    def registered(self) -> int:
        """How many allocations are registered now."""
        with self._lock:
            return len(self._by_handle)

    def close(self) -> None:
        if self._renewer:
            self._renewer.stop()
            self._renewer = None
        with self._lock:
            regions, self._by_handle = list(self._by_handle.values()), {}
        for region_id, _ in regions:
            try:
                unregister_region(self._client, region_id)
            except DriftkvError:
                pass
