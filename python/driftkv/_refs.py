"""Where an array lives: the TensorRef of an array that is already in memory
the server can reach, or None when its bytes must travel inline.

An array is referenced, never copied, when its bytes are exactly what the
wire field carries: C-contiguous, of the field's element type (numpy
float32/float16, and for outputs uint16 holding bf16 bit patterns; torch
float32, float16, bfloat16), and either inside a registered HostRegion of the client
(numpy arrays and CPU tensors, found by address) or a torch CUDA tensor
(its allocation registered by CUDA IPC on first use, cached). Anything else
(another dtype, a strided view, ordinary memory) returns None and goes
inline, so a caller never has to know which path a call took.
"""
import sys
import threading
import weakref
from typing import Any, List, Optional

import numpy as np

from driftkv import _tensors as T
from driftkv._proto import pb

# numpy dtypes that are a wire type as they are. numpy has no bfloat16: a
# uint16 destination holds bf16 bit patterns; a uint16 input is refused
# before sending (driftkv._validate: inputs are floating-point arrays).
_NUMPY_WIRE = {np.dtype("<f4"): "f32", np.dtype("<f2"): "fp16"}
BF16_BITS = np.dtype("<u2")


def exact_wire(x: Any, output: bool = False) -> Optional[str]:
    """The wire dtype whose bytes `x` holds as it is, or None."""
    if isinstance(x, np.ndarray):
        if output and x.dtype == BF16_BITS:
            return "bf16"
        return _NUMPY_WIRE.get(x.dtype)
    if T.is_torch(x):
        torch = sys.modules["torch"]
        return {torch.float32: "f32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(x.dtype)
    return None


def host_address(x: Any) -> Optional[int]:
    """The address of the first byte of a C-contiguous host array, else None."""
    if isinstance(x, np.ndarray):
        return int(x.__array_interface__["data"][0]) if x.flags.c_contiguous else None
    if T.is_torch(x):
        if x.is_cuda or not x.is_contiguous():
            return None
        return int(x.data_ptr())
    return None


def nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if T.is_torch(x):
        return int(x.numel() * x.element_size())
    return int(x.nbytes)


class Places:
    """The client's registered host regions (weakly held: a region dropped
    without close() stops being found) and its CUDA registrations
    (driftkv.regions.CudaRegions, made on first use, closed by close())."""

    def __init__(self, client):
        self._client = client
        self._lock = threading.Lock()
        self._hosts = weakref.WeakSet()
        # The regions as a tuple of weak references, rebuilt under the lock
        # on each change and read without it (a decode loop looks up
        # several arrays per Attend; iterating the WeakSet under the lock
        # each time was most of building a request).
        self._host_refs = ()
        self._cuda = None

    def add_host(self, region) -> None:
        with self._lock:
            self._hosts.add(region)
            self._host_refs = tuple(weakref.ref(r) for r in self._hosts)

    def discard_host(self, region) -> None:
        with self._lock:
            self._hosts.discard(region)
            self._host_refs = tuple(weakref.ref(r) for r in self._hosts)

    def cuda(self):
        """The CUDA registrations (driftkv.regions.CudaRegions)."""
        with self._lock:
            if self._cuda is None:
                from driftkv.regions import CudaRegions
                self._cuda = CudaRegions(self._client)
            return self._cuda

    def register_cuda(self, tensors) -> None:
        """Registers the allocations of torch CUDA tensors not registered
        yet (blocking: one RegisterRegion per new allocation)."""
        cuda = self.cuda()
        for t in tensors:
            cuda.ref(t)

    def close(self) -> None:
        """Closes the host regions still open (each unregisters itself and
        stops its lease renewer) and unregisters the CUDA registrations: the
        client's close(), after which nothing could renew or unregister
        them. An error of the server is not raised (its leases expire)."""
        from driftkv._errors import DriftkvError
        with self._lock:
            cuda, self._cuda = self._cuda, None
            hosts = list(self._hosts)
        for region in hosts:
            try:
                region.close()
            except DriftkvError:
                pass
        if cuda is not None:
            cuda.close()

    def ref(self, x: Any, wire: str, output: bool = False,
            unregistered: Optional[List[Any]] = None) -> Optional["pb.TensorRef"]:
        """The TensorRef of `x` read (or, output, written) as `wire`, or None.

        A CUDA tensor's allocation is registered on first use (an RPC); with
        an `unregistered` list it is not: such a tensor is appended there
        and gets None (inline)."""
        if exact_wire(x, output) != wire:
            return None
        if T.is_torch(x) and x.is_cuda:
            if not x.is_contiguous():
                return None
            if unregistered is None:
                return self.cuda().ref(x)
            ref = self.cuda().lookup(x)
            if ref is None:
                unregistered.append(x)
            return ref
        address = host_address(x)
        if address is None:
            return None
        size = nbytes(x)
        for host in self._host_refs:
            region = host()
            offset = region.offset_of(address, size) if region is not None else None
            if offset is not None:
                return region.ref(offset)
        return None

    def known(self) -> "KnownPlaces":
        return KnownPlaces(self)


class KnownPlaces:
    """Places as they are now, for a caller that must not wait on the
    server (the asyncio client's event loop): ref() registers nothing. A
    CUDA tensor whose allocation is not registered yet gets None and lands
    in `unregistered`; the caller registers those (Places.register_cuda, in
    a thread) and builds its request again."""

    def __init__(self, places: Places):
        self._places = places
        self.unregistered: List[Any] = []

    def ref(self, x: Any, wire: str, output: bool = False) -> Optional["pb.TensorRef"]:
        return self._places.ref(x, wire, output, self.unregistered)
