"""Fixtures: driftkv-server processes on loopback ports (the binary from
$DRIFTKV_SERVER_BIN or bazel-bin), and a Python proxy in front of one that
loses answers on purpose (to exercise the retry rules)."""
import os
import sys
import threading
import time
import uuid
from concurrent import futures

import grpc
import numpy as np
import pytest

try:
    import driftkv  # noqa: F401 - on PYTHONPATH (bazel test //python:pytest)
except ImportError:  # run from the source tree: python3 -m pytest python/tests
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from driftkv._proto import pb_grpc  # noqa: E402
from driftkv.local_server import LocalServer  # noqa: E402

# The eval model's shape (4 layers x 4 KV heads x 128), pages and window of
# 128 tokens: a layer's first page is made at 256 tokens.
MODEL_CONFIG = """
model { layers: 4 kv_heads: 4 head_dim: 128 }
codec { page_tokens: 128 }
pool_bytes: 33554432
window_tokens: 128
max_sequences: 256
"""


@pytest.fixture(scope="session")
def server():
    with LocalServer(config_text=MODEL_CONFIG) as s:
        yield s


def region_socket_server(tag: str) -> LocalServer:
    """A server of MODEL_CONFIG with a region socket of its own (host
    regions attach there), named so that concurrent test runs differ."""
    path = f"/tmp/driftkv-pytest-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
    return LocalServer(config_text=MODEL_CONFIG + f'region_socket: "{path}"\n')


@pytest.fixture(scope="session")
def hot_server():
    with LocalServer(config_text=MODEL_CONFIG + "hot_tier_bytes: 8388608\n") as s:
        yield s


class LosingProxy(pb_grpc.KvCacheServicer):
    """Forwards every call to the server; the first `lose[method]` calls of a
    method have their answer replaced by UNAVAILABLE after the server ran
    them (for Read: after the first chunk). `delay[method]` seconds are
    slept before forwarding. `calls[method]` counts calls, `requests`
    keeps the Read requests."""

    def __init__(self, target: str):
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 1 << 26),
                                                              ("grpc.max_send_message_length", 1 << 26)])
        self.stub = pb_grpc.KvCacheStub(self.channel)
        self.lose, self.delay, self.calls = {}, {}, {}
        self.read_requests = []
        self.mu = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(8),
                                  options=[("grpc.max_receive_message_length", 1 << 26),
                                           ("grpc.max_send_message_length", 1 << 26)])
        pb_grpc.add_KvCacheServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"
        self.server.start()

    def _enter(self, method):
        with self.mu:
            self.calls[method] = self.calls.get(method, 0) + 1
        time.sleep(self.delay.get(method, 0))

    def _lost(self, method) -> bool:
        with self.mu:
            if self.lose.get(method, 0) > 0:
                self.lose[method] -= 1
                return True
            return False

    def _forward(self, method, call, context):
        self._enter(method)
        try:
            answer = call()
        except grpc.RpcError as e:
            context.abort(e.code(), e.details())
        if self._lost(method):
            context.abort(grpc.StatusCode.UNAVAILABLE, "test: answer lost")
        return answer

    def Append(self, request_iterator, context):
        return self._forward("Append", lambda: self.stub.Append(request_iterator), context)

    def Attend(self, request, context):
        return self._forward("Attend", lambda: self.stub.Attend(request), context)

    def Release(self, request, context):
        return self._forward("Release", lambda: self.stub.Release(request), context)

    def Length(self, request, context):
        return self._forward("Length", lambda: self.stub.Length(request), context)

    def Fork(self, request, context):
        return self._forward("Fork", lambda: self.stub.Fork(request), context)

    def Pin(self, request, context):
        return self._forward("Pin", lambda: self.stub.Pin(request), context)

    def Unpin(self, request, context):
        return self._forward("Unpin", lambda: self.stub.Unpin(request), context)

    def Info(self, request, context):
        return self._forward("Info", lambda: self.stub.Info(request), context)

    def Stats(self, request, context):
        return self._forward("Stats", lambda: self.stub.Stats(request), context)

    def Read(self, request, context):
        self._enter("Read")
        with self.mu:
            self.read_requests.append((request.first_token, request.token_count))
        try:
            for i, chunk in enumerate(self.stub.Read(request)):
                yield chunk
                if i == 0 and self._lost("Read"):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "test: stream lost")
        except grpc.RpcError as e:
            context.abort(e.code(), e.details())

    def close(self):
        self.server.stop(0)
        self.channel.close()


@pytest.fixture
def proxy(server):
    p = LosingProxy(server.target)
    yield p
    p.close()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def kv(rng, tokens, kv_heads=4, head_dim=128, scale=1.0):
    """Keys and values [tokens, kv_heads, head_dim], float32, already
    bf16-representable (so that what the server stores is exactly them)."""
    from driftkv._tensors import bf16_bits_to_f32, f32_to_bf16_bits
    k = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32) * scale
    v = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    return bf16_bits_to_f32(f32_to_bf16_bits(k)), bf16_bits_to_f32(f32_to_bf16_bits(v))


def exact_attention(q, keys, values, scale=None):
    """float64 reference: q [QH, D], keys/values [T, KH, D] -> (out [QH, D], lse [QH])."""
    qh, d = q.shape
    rep = qh // keys.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    k = np.repeat(keys.astype(np.float64), rep, axis=1)    # [T, QH, D]
    v = np.repeat(values.astype(np.float64), rep, axis=1)
    s = np.einsum("hd,thd->ht", q.astype(np.float64), k) * scale
    m = s.max(-1, keepdims=True)
    w = np.exp(s - m)
    lse = (m[:, 0] + np.log(w.sum(-1)))
    return np.einsum("ht,thd->hd", w / w.sum(-1, keepdims=True), v), lse
