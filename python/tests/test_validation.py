"""Validation before sending: a call the client refuses raises
DriftkvError(INVALID_ARGUMENT) naming the field and the value, and nothing
of it reached the server (the LosingProxy in front counts every call; the
sequence's Length shows no decode step applied), in the sync, asyncio and
sharded clients, AttendStream and the doorbell."""
import asyncio
import uuid

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from conftest import LosingProxy, kv, region_socket_server
from driftkv import AttendItem, Chunk, DriftkvError

STACK = "(attend() stacks equal shapes; attend_results() takes any)"


def sid():
    return "v-" + uuid.uuid4().hex[:12]


@pytest.fixture
def stored(server, rng):
    """A sequence of 20 tokens in layer 0 (through the server directly), its
    keys and values, and the next token's."""
    s = sid()
    keys, values = kv(rng, 21)
    with driftkv.Client(server.target) as c:
        c.append(s, 0, keys[:20], values[:20])
    yield s, keys, values
    with driftkv.Client(server.target) as c:
        c.release(s)


def unequal_batch(s, keys, values, rng):
    """A decode step (token 20) then an item whose query has 4 heads, not 8:
    the server would take both (attend_results does), attend() cannot stack
    them."""
    q8 = rng.standard_normal((8, 128)).astype(np.float32)
    q4 = rng.standard_normal((4, 128)).astype(np.float32)
    return [AttendItem(s, 0, q8, new_key=keys[20], new_value=values[20], new_token_index=20), AttendItem(s, 0, q4)]


UNEQUAL = f"items[1].query has shape (4, 128); expected (8, 128) like items[0].query {STACK}"


def expect_invalid(call, details, sent=None):
    """call() raises DriftkvError(INVALID_ARGUMENT, details); `sent()`, when
    given, is checked first: what reached the server meanwhile."""
    with pytest.raises(DriftkvError) as e:
        call()
    if sent is not None:
        assert sent() == {}
    assert (e.value.code, e.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, details)


def test_unequal_queries_are_refused_before_the_decode_step_is_sent(server, proxy, stored, rng):
    s, keys, values = stored
    items = unequal_batch(s, keys, values, rng)
    with driftkv.Client(proxy.target) as c:
        expect_invalid(lambda: c.attend(items), UNEQUAL, lambda: proxy.calls)  # not even Info
        assert c.length(s)[0].tokens == 20
        # What the caller does next: the same step, sent once, stored once.
        c.attend_results(items)
        assert c.length(s)[0].tokens == 21
        assert proxy.calls["Attend"] == 1


def test_attend_stream_and_doorbell_check_before_sending(rng):
    with region_socket_server("validation") as srv, driftkv.Client(srv.target) as c:
        s = sid()
        keys, values = kv(rng, 21)
        c.append(s, 0, keys[:20], values[:20])
        items = unequal_batch(s, keys, values, rng)
        stored = lambda: {t: "tokens stored" for t in [c.length(s)[0].tokens] if t != 20}  # noqa: E731
        with c.attend_stream() as stream:
            expect_invalid(lambda: stream.attend(items), UNEQUAL, stored)
            out, lse = stream.attend(items[1])  # the stream goes on
            assert out.shape == (4, 128)
        with c.register_host_region(1 << 20) as region, c.open_doorbell(region, request_capacity=1 << 16,
                                                                        response_capacity=1 << 16) as bell:
            expect_invalid(lambda: bell.attend(items), UNEQUAL, stored)
            assert bell.attend(items[1]).output.shape == (4, 128)  # the doorbell still works


def bad_calls(s, keys, values, q):
    """(name, call(client), details): arguments only the client can see are
    wrong; none of them may send anything."""
    k, v = keys[0], values[0]
    read_only = np.zeros((8, 128), np.float32)
    read_only.flags.writeable = False
    return [
        ("keys as a list", lambda c: c.append(s, 0, keys.tolist(), values.tolist()),
         "keys is a list; expected a numpy array or a torch tensor"),
        ("values shorter than keys", lambda c: c.append(s, 0, keys, values[:8]),
         "values has shape (8, 4, 128); expected (20, 4, 128) like keys"),
        ("integer keys", lambda c: c.append(s, 0, keys.astype(np.int64), values),
         "keys has dtype int64; expected a floating-point array (float32, float16 or float64)"),
        ("chunk_tokens 0", lambda c: c.append(s, 0, keys, values, chunk_tokens=0),
         "chunk_tokens 0 out of range [1, 4294967295]"),
        ("a bad chunk after a good one", lambda c: c.append_chunks([Chunk(s, 0, 0, keys[:10], values[:10]),
                                                                    Chunk(s, 0, 10, keys[10:], values[10:12])]),
         "chunks[1].values has shape (2, 4, 128); expected (10, 4, 128) like keys"),
        ("a tuple where a chunk goes", lambda c: c.append_chunks([(s, 0, 0, keys, values)]),
         "chunks[0] is a tuple; expected a driftkv.Chunk"),
        ("query as a list", lambda c: c.attend(AttendItem(s, 0, q.tolist())),
         "items[0].query is a list; expected a numpy array or a torch tensor"),
        ("complex query", lambda c: c.attend(AttendItem(s, 0, q.astype(np.complex64))),
         "items[0].query has dtype complex64; expected a floating-point array (float32, float16 or float64)"),
        ("layer as a str", lambda c: c.attend(AttendItem(s, "0", q)), "items[0].layer is '0'; expected an integer"),
        ("sequence_id as an int", lambda c: c.attend(AttendItem(7, 0, q)),
         "items[0].sequence_id is 7; expected a str"),
        ("new_value of other heads", lambda c: c.attend(AttendItem(s, 0, q, new_key=k, new_value=v[:2],
                                                                   new_token_index=20)),
         "items[0].new_value has shape (2, 128); expected (4, 128) like new_key"),
        ("negative token index", lambda c: c.attend(AttendItem(s, 0, q, new_key=k, new_value=v,
                                                               new_token_index=-1)),
         "items[0].new_token_index -1 out of range [0, 18446744073709551615]"),
        ("unknown wire dtype", lambda c: c.attend([AttendItem(s, 0, q)], wire_dtype="int8"),
         "wire_dtype 'int8' is not one of bf16, fp16, f32"),
        ("read-only out", lambda c: c.attend(AttendItem(s, 0, q), out=read_only, lse=np.zeros(8, np.float32)),
         "out is read-only"),
        ("a str among the items", lambda c: c.attend_results([AttendItem(s, 0, q), "item"]),
         "items[1] is a str; expected a driftkv.AttendItem"),
        ("negative token_count", lambda c: c.read(s, 0, token_count=-1),
         "token_count -1 out of range [0, 4294967295]"),
        ("sequence_id as bytes", lambda c: c.release(s.encode()), f"sequence_id is {s.encode()!r}; expected a str"),
        ("timeout 0", lambda c: c.attend(AttendItem(s, 0, q), timeout=0),
         "timeout is 0; expected a number of seconds > 0"),
        ("pin without a lease", lambda c: c.pin("p", [1] * 128, ttl_seconds=0),
         "ttl_seconds is 0; expected a number of seconds > 0"),
        ("pin of no prompt", lambda c: c.pin("p", ttl_seconds=5), "pass one of prefix_token_ids and prefix_page_keys"),
        ("pin_id as bytes", lambda c: c.unpin(b"p"), "pin_id is b'p'; expected a str"),
        ("watch batch past 4096", lambda c: c.watch_pages(max_batch=4097), "max_batch 4097 out of range [0, 4096]"),
    ]


CASES = [name for name, _, _ in bad_calls("s", np.zeros((20, 4, 128), np.float32), np.zeros((20, 4, 128), np.float32),
                                           np.zeros((8, 128), np.float32))]


@pytest.mark.parametrize("name", CASES)
def test_client_side_failures_are_driftkv_errors_sent_nowhere(proxy, rng, name):
    s = sid()
    keys, values = kv(rng, 20)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    call, details = {n: (c, d) for n, c, d in bad_calls(s, keys, values, q)}[name]
    with driftkv.Client(proxy.target) as c:
        expect_invalid(lambda: call(c), details, lambda: proxy.calls)
        with pytest.raises(DriftkvError) as e:
            c.length(s)  # nothing was stored either
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_asyncio_client_checks_before_sending(proxy, stored, rng):
    s, keys, values = stored
    items = unequal_batch(s, keys, values, rng)

    async def main():
        async with driftkv.aio.Client(proxy.target) as c:
            calls = dict(proxy.calls)  # Info, from __aenter__
            with pytest.raises(DriftkvError) as e:
                await c.attend(items)
            assert proxy.calls == calls
            assert (e.value.code, e.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, UNEQUAL)
            with pytest.raises(DriftkvError) as e:
                await c.append(s, 0, keys, values[:5], first_token=0)
            assert e.value.details == "values has shape (5, 4, 128); expected (21, 4, 128) like keys"
            assert proxy.calls == calls
            for call, details in ((lambda: c.pin("p", [1] * 128, ttl_seconds=-1),
                                   "ttl_seconds is -1; expected a number of seconds > 0"),
                                  (lambda: c.watch_pages(buffer_events=-1),
                                   "buffer_events -1 out of range [0, 1048576]")):
                with pytest.raises(DriftkvError) as e:
                    await call()
                assert (e.value.code, e.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, details)
            assert proxy.calls == calls
            assert (await c.length(s))[0].tokens == 20

    asyncio.run(main())


def owned_ids(router_names, n_each=1):
    """Sequence ids owned by each of the names, n_each of each."""
    out = {name: [] for name in router_names}
    i = 0
    while any(len(v) < n_each for v in out.values()):
        s = f"v-{uuid.uuid4().hex[:8]}-{i}"
        owner = router_names[driftkv.rendezvous_owner(router_names, s)]
        if len(out[owner]) < n_each:
            out[owner].append(s)
        i += 1
    return out


def test_sharded_client_sends_no_replica_its_part_of_a_bad_batch(server, rng):
    names = ["replica-a:1", "replica-b:2"]
    proxies = [LosingProxy(server.target) for _ in names]
    ids = owned_ids(names)
    a, b = ids[names[0]][0], ids[names[1]][0]
    keys, values = kv(rng, 21)
    q8 = rng.standard_normal((8, 128)).astype(np.float32)
    try:
        with driftkv.Client(server.target) as direct:
            for s in (a, b):
                direct.append(s, 0, keys[:20], values[:20])
            for p in proxies:
                p.calls.clear()
            sharded = driftkv.ShardedClient(names, clients=[driftkv.Client(p.target) for p in proxies])
            step = AttendItem(a, 0, q8, new_key=keys[20], new_value=values[20], new_token_index=20)
            bad = AttendItem(b, 0, q8.astype(np.int32))
            details = "items[1].query has dtype int32; expected a floating-point array (float32, float16 or float64)"
            sent = lambda: {i: p.calls for i, p in enumerate(proxies) if p.calls}  # noqa: E731
            for call in (sharded.attend, sharded.attend_each, sharded.attend_results):
                expect_invalid(lambda: call([step, bad]), details, sent)
            expect_invalid(lambda: sharded.attend([step, AttendItem(b, 0, q8[:4])]), UNEQUAL, sent)
            expect_invalid(lambda: sharded.append_chunks([Chunk(a, 1, 0, keys, values),
                                                          Chunk(b, 1, 0, keys, values[:3])]),
                           "chunks[1].values has shape (3, 4, 128); expected (21, 4, 128) like keys", sent)
            assert [direct.length(s)[0].tokens for s in (a, b)] == [20, 20]
            assert [direct.length(s)[1].tokens for s in (a, b)] == [0, 0]

            async def main():
                clients = [driftkv.aio.Client(p.target) for p in proxies]
                async with driftkv.aio.ShardedClient(names, clients=clients) as aio_sharded:
                    for call in (aio_sharded.attend, aio_sharded.attend_each, aio_sharded.attend_results):
                        with pytest.raises(DriftkvError) as e:
                            await call([step, bad])
                        assert sent() == {}
                        assert (e.value.code, e.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, details)

            asyncio.run(main())
            assert [p.calls for p in proxies] == [{}, {}]
            assert [direct.length(s)[0].tokens for s in (a, b)] == [20, 20]
            sharded.close()
            for s in (a, b):
                direct.release(s)
    finally:
        for p in proxies:
            p.close()
