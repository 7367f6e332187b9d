"""Python conventions of the package: repr of the clients and LocalServer
(never a secret), close() final and idempotent, timeout= on every call,
KeyboardInterrupt cancelling the call it interrupts, py.typed shipped."""
import asyncio
import os
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from conftest import MODEL_CONFIG
from driftkv import DriftkvError
from driftkv._proto import pb, pb_grpc
from driftkv.local_server import LocalServer

TOKEN = "secret-token-0123456789"


def test_repr_names_target_and_state_never_the_token(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot checked before the first call\n-----END CERTIFICATE-----\n")
    c = driftkv.Client("kv-0.example:50051", tls_ca=str(ca), token=TOKEN)
    assert repr(c) == "<driftkv.Client target='kv-0.example:50051' tls open>"
    c.close()
    assert repr(c) == "<driftkv.Client target='kv-0.example:50051' tls closed>" and c.closed

    a = driftkv.aio.Client("127.0.0.1:1", tls_ca=str(ca), token=TOKEN)
    assert repr(a) == "<driftkv.aio.Client target='127.0.0.1:1' tls open>"
    asyncio.run(a.close())
    assert repr(a) == "<driftkv.aio.Client target='127.0.0.1:1' tls closed>"

    s = driftkv.ShardedClient(["a:1", "b:2"], tls_ca=str(ca), token=TOKEN)
    assert repr(s) == "<driftkv.ShardedClient replicas=['a:1', 'b:2'] open>"
    assert "tls open" in repr(s.client(0))
    s.close()
    assert repr(s) == "<driftkv.ShardedClient replicas=['a:1', 'b:2'] closed>"
    sa = driftkv.aio.ShardedClient(["a:1"])
    assert repr(sa) == "<driftkv.aio.ShardedClient replicas=['a:1'] open>"
    for x in (c, a, s, sa):
        assert TOKEN not in repr(x) and str(ca) not in repr(x)


def test_local_server_repr_says_target_and_whether_it_runs():
    with LocalServer(config_text=MODEL_CONFIG) as srv:
        assert repr(srv) == (f"<driftkv.local_server.LocalServer target='{srv.target}' pid={srv.process.pid} "
                             "running>")
        srv.stop()
        assert repr(srv).endswith(f"pid={srv.process.pid} stopped, exit code {srv.process.returncode}>")


def test_close_is_idempotent_and_final(server):
    c = driftkv.Client(server.target)
    assert c.info().layers == 4
    c.close()
    c.close()
    calls = [c.info, c.stats, lambda: c.length("s"), lambda: c.release("s"), lambda: c.read("s", 0),
             lambda: c.attend(driftkv.AttendItem("s", 0, np.zeros((8, 128), np.float32))),
             c.attend_stream, lambda: c.register_host_region(4096), lambda: c.server_info]
    for call in calls:
        with pytest.raises(DriftkvError) as e:
            call()
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert e.value.details == f"<driftkv.Client target='{server.target}' closed> is closed; make a new client"

    with driftkv.ShardedClient([server.target]) as s:
        assert s.info_all()[0].layers == 4
    s.close()
    item = driftkv.AttendItem("s", 0, np.zeros((8, 128), np.float32))
    for call in (lambda: s.length("s"), s.info_all, lambda: s.attend_each([item])):
        with pytest.raises(DriftkvError) as e:
            call()
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "is closed" in e.value.details

    async def main():
        async with driftkv.aio.Client(server.target) as a:
            assert (await a.info()).layers == 4
        await a.close()
        with pytest.raises(DriftkvError) as e:
            await a.length("s")
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "is closed" in e.value.details
        sa = driftkv.aio.ShardedClient([server.target])
        await sa.close()
        await sa.close()
        with pytest.raises(DriftkvError) as e:
            await sa.info_all()
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION

    asyncio.run(main())


class Holding(pb_grpc.KvCacheServicer):
    """A server whose calls (but Info) hold until the client cancels them
    (or 10 s pass); `done` is set when the held call ended, `cancelled`
    then says whether the client had cancelled it."""

    def __init__(self):
        self.held = threading.Event()
        self.done = threading.Event()
        self.cancelled = False
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_KvCacheServicer_to_server(self, self.server)
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def Info(self, request, context):
        return pb.InfoResponse(layers=1, kv_heads=4, head_dim=128, max_message_bytes=1 << 26, max_batch=64)

    def _hold(self, context):
        self.held.set()
        start = time.monotonic()
        while context.is_active() and time.monotonic() - start < 10:
            time.sleep(0.005)
        self.cancelled = not context.is_active()
        self.done.set()

    def Length(self, request, context):
        self._hold(context)
        return pb.LengthResponse()

    def Attend(self, request, context):
        self._hold(context)
        return pb.AttendResponse()

    def Read(self, request, context):
        yield pb.ReadChunk(first_token=0, token_count=1, dtype=pb.DTYPE_F32, keys=bytes(2048), values=bytes(2048))
        self._hold(context)

    def Append(self, request_iterator, context):
        next(request_iterator)
        self._hold(context)
        return pb.AppendResponse()

    def AttendStream(self, request_iterator, context):
        for frame in request_iterator:
            self._hold(context)
            yield pb.AttendFrameResult(frame_id=frame.frame_id)

    def close(self):
        self.server.stop(0)


@pytest.fixture
def holding():
    h = Holding()
    yield h
    h.close()


def after_held(holding, action, delay=0.1):
    """Runs action() on a thread once the server holds a call."""
    def run():
        if holding.held.wait(10):
            time.sleep(delay)
            action()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_close_cancels_the_calls_in_flight(holding):
    c = driftkv.Client(holding.target, timeout=20)
    c.info()
    after_held(holding, c.close)
    start = time.monotonic()
    with pytest.raises(DriftkvError) as e:
        c.length("s")
    assert time.monotonic() - start < 5
    assert (e.value.code, e.value.details) == (
        grpc.StatusCode.CANCELLED, f"<driftkv.Client target='{holding.target}' closed> was closed during the call; "
        "make a new client")
    assert holding.done.wait(5) and holding.cancelled


# -- deadlines and cancellation ------------------------------------------------

def held_calls(c):
    """(name, call) of the calls Holding holds, each with timeout=."""
    item = driftkv.AttendItem("s", 0, np.zeros((8, 128), np.float32))
    kv = np.zeros((4, 4, 128), np.float32)
    return [("length", lambda t: c.length("s", timeout=t)), ("attend", lambda t: c.attend(item, timeout=t)),
            ("read", lambda t: c.read("s", 0, timeout=t)), ("append", lambda t: c.append("s", 0, kv, kv, timeout=t))]


def reset(holding):
    holding.held.clear()
    holding.done.clear()
    holding.cancelled = False


def test_every_call_takes_a_timeout_that_cancels_it(holding, server):
    with driftkv.Client(holding.target, timeout=30, retry=driftkv.RetryPolicy(max_attempts=1)) as c:
        assert c.info(timeout=5).layers == 1
        for name, call in held_calls(c):
            reset(holding)
            start = time.monotonic()
            with pytest.raises(DriftkvError) as e:
                call(0.3)
            assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, name
            assert time.monotonic() - start < 5, name
            assert holding.done.wait(5) and holding.cancelled, name
    with driftkv.Client(server.target) as c:
        assert c.stats(timeout=5).capacity_pages > 0
    with driftkv.ShardedClient([server.target]) as s:
        assert s.info_all(timeout=5)[0].layers == 4 and s.stats_all(timeout=5)[0].capacity_pages > 0
        with pytest.raises(DriftkvError) as e:
            s.length("no-such-sequence", timeout=5)
        assert e.value.code == grpc.StatusCode.NOT_FOUND

    async def main():
        async with driftkv.aio.Client(holding.target, timeout=30) as a:
            reset(holding)
            with pytest.raises(DriftkvError) as e:
                await a.length("s", timeout=0.3)
            assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert (await a.info(timeout=5)).layers == 1

    asyncio.run(main())
    assert holding.done.wait(5) and holding.cancelled


def interrupt_when_held(holding):
    """KeyboardInterrupt in the main thread (the test's) 0.1 s after the
    server started holding a call."""
    import _thread
    return after_held(holding, _thread.interrupt_main)


@pytest.mark.parametrize("name", ["length", "attend", "read", "append"])
def test_keyboard_interrupt_cancels_the_call(holding, name):
    kept = []
    with driftkv.Client(holding.target, timeout=30) as c:
        c.info()
        call = dict(held_calls(c))[name]
        interrupt_when_held(holding)
        try:
            call(None)
        except KeyboardInterrupt as e:
            kept.append(e)  # the traceback (and its frames) stays alive: no help from the collector
        assert kept, "the call returned"
        assert holding.done.wait(5) and holding.cancelled


def test_an_interrupted_attend_stream_is_broken_not_out_of_step(holding):
    item = driftkv.AttendItem("s", 0, np.zeros((8, 128), np.float32))
    with driftkv.Client(holding.target, timeout=30) as c:
        stream = c.attend_stream()
        interrupt_when_held(holding)
        with pytest.raises(KeyboardInterrupt):
            stream.attend(item)
        assert holding.done.wait(5) and holding.cancelled  # the call is cancelled, not left holding
        # Frame 1's answer will never be taken for frame 2's.
        with pytest.raises(DriftkvError) as e:
            stream.attend(item)
        assert (e.value.code, e.value.details) == (
            grpc.StatusCode.CANCELLED, "the AttendStream was interrupted waiting for frame 1; open another")
        stream.close()


def test_py_typed_ships_with_the_package():
    """PEP 561: the marker next to __init__.py, and the package data that
    puts it in a wheel."""
    package = os.path.dirname(driftkv.__file__)
    assert os.path.isfile(os.path.join(package, "py.typed"))
    if sys.version_info < (3, 11):
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11)")
    import tomllib
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["driftkv"]
