"""TLS, mTLS and bearer tokens from Python (sync, asyncio, sharded), with a
CA and certificates minted by openssl at test time; and the chunk checksum
and tombstones as the Python client sees them."""
import asyncio
import hashlib
import os
import subprocess

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from driftkv import _crc32c, prefix
from driftkv._proto import pb, pb_grpc
from driftkv._wire import chunk_message
from driftkv.local_server import LocalServer
from conftest import MODEL_CONFIG
from test_pins import LAYERS, P, Collector, expected, random_ids, store, subscribe

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-fedcba9876543210"


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    with open(f"{d}/server.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", "-x509", *key, "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem", "-days", "2", "-subj", "/CN=ca")
    for name, ext in (("server", ["-extfile", f"{d}/server.ext"]), ("client", [])):
        _openssl("req", *key, "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr", "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
                 "-CAcreateserial", "-days", "2", *ext, "-out", f"{d}/{name}.pem")
    with open(f"{d}/tokens", "w") as f:
        for token, tenant in ((ALICE, "alice"), (BOB, "bob")):
            f.write(f"{hashlib.sha256(token.encode()).hexdigest()} {tenant}\n")
    return d


@pytest.fixture(scope="module")
def secure_server(pki):
    config = MODEL_CONFIG + (f'tls_cert_file: "{pki}/server.pem"\ntls_key_file: "{pki}/server.key"\n'
                             f'tls_client_ca_file: "{pki}/ca.pem"\ntokens_file: "{pki}/tokens"\n')
    with LocalServer(config_text=config) as s:
        yield s


def _client(server, pki, token, cert=True, cls=driftkv.Client, **kw):
    tls = dict(tls_ca=f"{pki}/ca.pem", token=token)
    if cert:
        tls.update(tls_cert=f"{pki}/client.pem", tls_key=f"{pki}/client.key")
    return cls(server.target, timeout=10, retry=driftkv.RetryPolicy(max_attempts=1), **tls, **kw)


def _kv(tokens, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, 4, 128)).astype(np.float32),
            rng.standard_normal((tokens, 4, 128)).astype(np.float32))


def test_crc32c_matches_the_standard_check_value():
    assert _crc32c.crc32c(b"123456789") == 0xE3069283
    data = os.urandom(100_003)
    assert _crc32c._numpy_extend(0, data) == _crc32c._python_extend(0, data)
    assert _crc32c.crc32c_extend(_crc32c.crc32c(data[:5000]), data[5000:]) == _crc32c.crc32c(data)


def test_chunks_carry_their_checksum():
    k, v = _kv(3)
    m = chunk_message(driftkv.Chunk("s", 0, 0, k, v, "bf16"))
    assert m.HasField("crc32c") and m.crc32c == _crc32c.crc32c(m.keys + m.values)


def test_a_corrupted_chunk_is_data_loss(server):
    k, v = _kv(4)
    m = chunk_message(driftkv.Chunk("crc-py", 0, 0, k, v, "bf16"))
    m.crc32c ^= 0xFFFF
    with grpc.insecure_channel(server.target) as ch:
        stub = pb_grpc.KvCacheStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Append(iter([m]), timeout=10)
        assert e.value.code() == grpc.StatusCode.DATA_LOSS
        with pytest.raises(grpc.RpcError) as e:
            stub.Length(pb.LengthRequest(sequence_id="crc-py"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_released_id_needs_a_new_incarnation(server):
    c = driftkv.Client(server.target)
    k, v = _kv(8)
    c.append("tomb-py", 0, k, v)
    c.release("tomb-py")
    with pytest.raises(driftkv.DriftkvError) as e:
        c.append("tomb-py", 0, k, v)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "new_incarnation" in e.value.details
    c.append_chunks([driftkv.Chunk("tomb-py", 0, 0, k, v, new_incarnation=True)])
    assert c.length("tomb-py")[0].tokens == 8


def test_tokens_and_tenants_sync(secure_server, pki):
    k, v = _kv(16, 1)
    with _client(secure_server, pki, ALICE) as alice, _client(secure_server, pki, BOB) as bob:
        alice.append("chat", 0, k, v)
        assert alice.length("chat")[0].tokens == 16
        for call in (lambda: bob.length("chat"), lambda: bob.read("chat", 0), lambda: bob.release("chat")):
            with pytest.raises(driftkv.DriftkvError) as e:
                call()
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert alice.stats().tenant == "alice"
    for token in ("", "not-a-valid-token-000000"):
        with pytest.raises(driftkv.DriftkvError) as e:
            _client(secure_server, pki, token or None).info()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(driftkv.DriftkvError) as e:  # no client certificate: the handshake is refused
        _client(secure_server, pki, ALICE, cert=False).info()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_tokens_asyncio_and_sharded(secure_server, pki):
    async def run():
        async with _client(secure_server, pki, ALICE, cls=driftkv.aio.Client) as c:
            k, v = _kv(5, 2)
            await c.append("aio-chat", 0, k, v)
            return (await c.length("aio-chat"))[0].tokens
    assert asyncio.run(run()) == 5
    sharded = driftkv.ShardedClient([secure_server.target], tls_ca=f"{pki}/ca.pem", tls_cert=f"{pki}/client.pem",
                                    tls_key=f"{pki}/client.key", token=BOB)
    with sharded:
        assert [s.tenant for s in sharded.stats_all()] == ["bob"]


def test_page_events_and_pins_are_the_tenants_own(secure_server, pki):
    rng = np.random.default_rng(7)
    with _client(secure_server, pki, ALICE) as alice, _client(secure_server, pki, BOB) as bob:
        got = Collector(alice.watch_pages())
        subscribe(alice, got, rng)
        bobs, alices = random_ids(rng, P), random_ids(rng, P)
        store(bob, rng, bobs)
        store(alice, rng, alices)
        assert got.wait_for(expected("stored", alices))
        # Events come in order: bob's, stored first, would be there by now.
        assert not {key for _, key, _ in got.seen()} & set(prefix.page_keys(bobs, P))
        assert alice.pin("same-name", alices, ttl_seconds=30).pages_pinned == LAYERS
        with pytest.raises(driftkv.DriftkvError) as e:
            bob.pin("same-name", alices, ttl_seconds=30)
        assert e.value.code == grpc.StatusCode.NOT_FOUND and "was never stored" in e.value.details
        with pytest.raises(driftkv.DriftkvError) as e:
            bob.unpin("same-name")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert alice.unpin("same-name") == LAYERS
        got.watch.cancel()
        got.thread.join(5)
        assert got.error is None


def test_a_token_is_never_sent_in_plaintext():
    with pytest.raises(driftkv.DriftkvError) as e:
        driftkv.Client("127.0.0.1:1", token=ALICE)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "needs TLS" in e.value.details
