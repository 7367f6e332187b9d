"""The prefix cache from Python: page keys against vectors computed with
hashlib by hand (the same vectors as tests/prefix_cache_test.cc checks the
server's against), append with token_ids, lookup and fork_from_prefix in
both clients, and their refusals."""
import asyncio
import hashlib
import struct
import uuid

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from conftest import kv
from driftkv import prefix


def sid():
    return "p-" + uuid.uuid4().hex[:12]


@pytest.fixture
def client(server):
    with driftkv.Client(server.target, timeout=20) as c:
        yield c


def test_page_keys_match_fixed_vectors():
    assert prefix.ROOT.hex() == "1174970676183745ff488e59518b4982"
    assert [k.hex() for k in prefix.page_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)] == [
        "12562a842dad2df419d7e5d3f9aea541", "c6d880be1218d3fdc0e607ec7b4ca61e"]
    assert [k.hex() for k in prefix.page_keys(range(1000, 1064), 32)] == [
        "9d4411a3d285023a38a99a8bec8c18b7", "cc4bedde7a7229c901f61622055642b5"]
    assert [k.hex() for k in prefix.page_keys(np.array([0xFFFFFFFF, 0, 0x12345678, 7], np.uint32), 4)] == [
        "4ec57aeac09b693a10b772753f8b026d"]
    # The chain, written out once more from its definition.
    k0 = hashlib.sha256(prefix.ROOT + struct.pack("<4I", 1, 2, 3, 4)).digest()[:16]
    assert prefix.next_page_key(prefix.ROOT, [1, 2, 3, 4]) == k0
    assert prefix.page_keys([1, 2, 3], 4) == []
    with pytest.raises(driftkv.DriftkvError):
        prefix.page_keys([-1, 2, 3, 4], 4)


def test_fork_from_a_prefix_answers_as_a_fresh_sequence(client, rng):
    s, f, w = sid(), sid(), sid()
    keys, values = kv(rng, 700)
    ids = rng.integers(0, 2**32, 700, dtype=np.uint64).tolist()
    for layer in range(4):
        client.append(s, layer, keys[:600], values[:600], token_ids=ids[:600])  # 3 pages of 128 per layer
    client.release(s)  # the pages stay as cache
    r = client.lookup(ids)
    assert r == driftkv.LookupResult(5, 3, 384, [3] * 4, "never_stored", 3, 0, r.miss_message)
    assert client.lookup(page_keys=prefix.page_keys(ids, 128)) == r
    pages = client.stats().pages_in_use
    got = client.fork_from_prefix(f, ids)
    assert got == driftkv.ForkResult([driftkv.LayerLength(384, 384, 0)] * 4, 12, 384)
    assert client.stats().pages_in_use == pages
    q = rng.standard_normal((8, 128)).astype(np.float32)
    for layer in range(4):
        client.append(f, layer, keys[384:], values[384:], first_token=384, token_ids=ids[384:])
        client.append(w, layer, keys, values, token_ids=ids)
        a, b = client.read(f, layer), client.read(w, layer)
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.values, b.values)
        x, y = client.attend(driftkv.AttendItem(f, layer, q)), client.attend(driftkv.AttendItem(w, layer, q))
        np.testing.assert_array_equal(x.output, y.output)
        np.testing.assert_array_equal(x.lse, y.lse)
    assert client.lookup(ids).pages == 4
    for x in (f, w):
        client.release(x)


def test_prefix_refusals(client, rng):
    keys, values = kv(rng, 10)
    for call, details in (
            (lambda: client.append(sid(), 0, keys, values, token_ids=[1, 2]),
             "token_ids has 2 ids; the chunk has 10 tokens (one id per token)"),
            (lambda: client.lookup(), "pass one of token_ids and page_keys"),
            (lambda: client.lookup([1], page_keys=[b"k" * 16]), "pass one of token_ids and page_keys"),
            (lambda: client.lookup(page_keys=[b"abc"]),
             "page_keys[0] is not 16 bytes; page keys are driftkv.prefix.page_keys' bytes"),
            (lambda: client.lookup([2**32]), "token_ids[0] is 4294967296; token ids are uint32")):
        with pytest.raises(driftkv.DriftkvError) as e:
            call()
        assert (e.value.code, e.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, details)
    with pytest.raises(driftkv.DriftkvError) as e:
        client.fork_from_prefix(sid(), page_keys=[b"\0" * 16])
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "was never stored with token_ids" in e.value.details


def test_lookup_and_fork_from_a_prefix_in_asyncio(server, rng):
    s, f = sid(), sid()
    keys, values = kv(rng, 400)
    ids = rng.integers(0, 2**32, 400, dtype=np.uint64).tolist()

    async def main():
        async with driftkv.aio.Client(server.target) as c:
            for layer in range(4):
                await c.append(s, layer, keys, values, token_ids=ids)  # 2 pages per layer
            r = await c.lookup(ids)
            assert (r.pages, r.tokens, r.miss_reason) == (2, 256, "never_stored")
            got = await c.fork_from_prefix(f, ids, max_tokens=128)
            assert got.tokens == 128 and got.pages_shared == 4
            back = await c.read(f, 3)
            np.testing.assert_array_equal(back.keys, (await c.read(s, 3, token_count=128)).keys)
            await c.release(s)
            await c.release(f)

    asyncio.run(main())
