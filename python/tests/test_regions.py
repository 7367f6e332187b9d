"""Host memory regions from Python (driftkv/regions.py): a region's numpy
views share pages with the server, its lease is renewed and it is
unregistered on close; the region socket refuses an unsealed memfd; an
attach token registers once."""
import os
import socket

import grpc
import numpy as np
import pytest

import driftkv
from driftkv._errors import DriftkvError
from driftkv._proto import pb
from driftkv.local_server import LocalServer
from driftkv import regions as R


MODEL_CONFIG = """
model { layers: 2 kv_heads: 2 head_dim: 64 }
codec { page_tokens: 32 }
pool_bytes: 4194304
window_tokens: 32
"""


@pytest.fixture(scope="module")
def region_server():
    path = f"/tmp/driftkv-pytest-regions-{os.getpid()}.sock"
    with LocalServer(config_text=MODEL_CONFIG + f'region_socket: "{path}"\nregion_lease_seconds: 3\n') as s:
        s.region_socket = path
        yield s
    assert not os.path.exists(path), "the socket file outlived the server"


def test_host_region_registers_shares_memory_and_unregisters(region_server):
    with driftkv.Client(region_server.target, timeout=20) as c:
        region = c.register_host_region(1 << 16, name="pytest")
        assert region.id != 0 and region.size == 1 << 16 and region.lease_seconds == 3
        view = region.ndarray(4096, (4, 128), np.float32)
        view[:] = np.arange(512, dtype=np.float32).reshape(4, 128)
        # A second mapping of the same memory (the server's is another):
        # the bytes are in the shared pages, not in a private copy.
        again = region.ndarray(4096 + 4 * 128, (128,), np.float32)
        np.testing.assert_array_equal(again, np.arange(128, 256, dtype=np.float32))
        assert region.ref(64) == pb.TensorRef(region_id=region.id, offset=64)
        stats = c._connect().Stats(pb.StatsRequest())
        assert stats.regions == 1 and stats.region_bytes == 1 << 16
        # Past the lease (3 s): the daemon thread kept it alive.
        import time
        time.sleep(4.5)
        region.renew()
        del view, again
        region.close()
        assert c._connect().Stats(pb.StatsRequest()).regions == 0
        with pytest.raises(DriftkvError) as e:
            R.unregister_region(c, region.id)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert e.value.details == f"region_id {region.id} not found"


def test_the_socket_refuses_an_unsealed_memfd(region_server):
    fd = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    try:
        with pytest.raises(DriftkvError) as e:
            R._attach(region_server.region_socket, fd, 5.0)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "not sealed with F_SEAL_SHRINK" in e.value.details
    finally:
        os.close(fd)


def test_an_attach_token_registers_once(region_server):
    with driftkv.Client(region_server.target, timeout=20) as c:
        fd = R.sealed_memfd("once", 8192)
        try:
            token, size = R._attach(region_server.region_socket, fd, 5.0)
        finally:
            os.close(fd)
        assert size == 8192 and len(token) == 16
        req = pb.RegisterRegionRequest(kind=pb.REGION_HOST_SHM, attach_token=token)
        first = R.register_region(c, req)
        with pytest.raises(DriftkvError) as e:
            R.register_region(c, req)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert e.value.details == "attach_token unknown, used already or expired"
        R.unregister_region(c, first.region_id)


def test_reference_errors_name_the_ref_field(region_server):
    """The server's messages name the field holding the reference
    ("items[0].query_ref"), not the inline field it replaces."""
    with driftkv.Client(region_server.target, timeout=20) as c:
        with c.register_host_region(4096, name="pytest-errors") as region:
            for ref, code, words in (
                    (pb.TensorRef(region_id=12345), grpc.StatusCode.NOT_FOUND,
                     "items[0].query_ref.region_id 12345 not found"),
                    (region.ref(4096 - 4), grpc.StatusCode.OUT_OF_RANGE, "items[0].query_ref.offset 4092 + ")):
                req = pb.AttendRequest()
                m = req.items.add(sequence_id="none", layer=0, dtype=pb.DTYPE_F32, q_heads=2, head_dim=64)
                m.query_ref.CopyFrom(ref)
                with pytest.raises(DriftkvError) as e:
                    c.attend(req)
                assert e.value.code == code
                assert e.value.details.startswith(words), e.value.details


def test_the_ipc_handle_inside_torchs_shareable_handle():
    """torch's shareable handle of a block: the raw 64-byte
    cudaIpcMemHandle_t (older torch) or a version byte and a kind byte
    before it; a block of an expandable segment has none to register."""
    from driftkv.regions import _ipc_handle
    raw = bytes(range(64))
    assert _ipc_handle(raw) == raw
    assert _ipc_handle(bytes([2, ord("c")]) + raw) == raw
    assert _ipc_handle(bytes([3, ord("c")]) + raw) == raw
    for bad in (bytes([2, ord("e")]) + raw, bytes(65), bytes(10)):
        with pytest.raises(driftkv.DriftkvError) as e:
            _ipc_handle(bad)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
