"""The retry and deadline rules (docs/api.md, "Retries and deadlines"),
with answers lost on purpose by a proxy (conftest.LosingProxy): retried
calls store their data once, the non-idempotent decode step, Fork and
Unpin are not retried, Pin is, Read resumes after the last chunk,
deadlines end a call."""
import uuid

import grpc
import numpy as np
import pytest

import driftkv
from conftest import kv

FAST = driftkv.RetryPolicy(max_attempts=4, initial_backoff=0.005, max_backoff=0.02)


def sid():
    return "r-" + uuid.uuid4().hex[:12]


@pytest.fixture
def client(proxy):
    with driftkv.Client(proxy.target, timeout=20, retry=FAST) as c:
        c.info()  # connect before any loss is armed
        yield c


def test_lost_append_answer_is_retried_and_stored_once(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 300)
    before = client.stats().tokens_ingested
    proxy.lose["Append"] = 2
    r = client.append(s, 0, keys, values, chunk_tokens=70)
    assert client.retries == 2 and proxy.calls["Append"] == 3
    assert r == driftkv.AppendResult(5, 0, 300)  # the third attempt found everything stored
    assert client.length(s)[0].tokens == 300
    assert client.stats().tokens_ingested - before == 300
    client.release(s)


def test_lost_append_of_an_iterator_resends_what_was_sent(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 100)
    proxy.lose["Append"] = 1
    r = client.append_chunks(driftkv.Chunk(s, 0, t, keys[t:t + 25], values[t:t + 25]) for t in range(0, 100, 25))
    assert client.retries == 1 and r.tokens_duplicate == 100
    np.testing.assert_array_equal(client.read(s, 0).keys, keys)
    client.release(s)


def test_decode_step_is_retried_only_with_its_index(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 12)
    client.append(s, 0, keys[:10], values[:10])
    q = rng.standard_normal((8, 128)).astype(np.float32)
    proxy.lose["Attend"] = 1
    with pytest.raises(driftkv.DriftkvError) as e:
        client.attend(driftkv.AttendItem(s, 0, q, new_key=keys[10], new_value=values[10]))
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert proxy.calls["Attend"] == 1 and client.retries == 0
    assert client.length(s)[0].tokens == 11  # the server stored it; a repeat would store it twice
    proxy.lose["Attend"] = 1
    out, _ = client.attend(driftkv.AttendItem(s, 0, q, new_key=keys[11], new_value=values[11], new_token_index=11))
    assert proxy.calls["Attend"] == 3 and client.retries == 1
    assert client.length(s)[0].tokens == 12
    proxy.lose["Attend"] = 1
    client.attend(driftkv.AttendItem(s, 0, q))  # read-only: retried
    assert client.retries == 2
    client.release(s)


def test_lost_read_stream_resumes_after_the_last_chunk(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 600, scale=0.5)
    client.append(s, 0, keys, values)
    whole = client.read(s, 0, first_token=10)
    proxy.read_requests.clear()
    proxy.lose["Read"] = 1
    resumed = client.read(s, 0, first_token=10)
    assert proxy.read_requests == [(10, 0), (266, 0)]  # read_chunk_tokens 256: one chunk arrived
    np.testing.assert_array_equal(resumed.keys, whole.keys)
    np.testing.assert_array_equal(resumed.values, whole.values)
    assert resumed.compressed_tokens == whole.compressed_tokens == 374
    proxy.read_requests.clear()
    proxy.lose["Read"] = 1
    part = client.read(s, 0, first_token=100, token_count=300)
    assert proxy.read_requests == [(100, 300), (356, 44)]
    np.testing.assert_array_equal(part.keys, whole.keys[90:390])
    client.release(s)


def test_lost_release_answer_is_success(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 5)
    client.append(s, 0, keys, values)
    proxy.lose["Release"] = 1
    assert client.release(s) == driftkv.ReleaseResult(0, 0)  # the repeat found it freed
    assert proxy.calls["Release"] == 2
    with pytest.raises(driftkv.DriftkvError) as e:
        client.length(s)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(driftkv.DriftkvError) as e:  # a first NOT_FOUND is an error
        client.release(s)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_fork_is_never_retried(client, proxy, rng):
    s, f = sid(), sid()
    keys, values = kv(rng, 300)
    for layer in range(4):
        client.append(s, layer, keys, values)
    proxy.lose["Fork"] = 1
    with pytest.raises(driftkv.DriftkvError) as e:
        client.fork(s, f, 128)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert proxy.calls["Fork"] == 1 and client.retries == 0
    assert client.length(f)[0] == driftkv.LayerLength(128, 128, 0)  # the lost answer's fork was made
    client.release(f)
    client.release(s)


def test_a_lost_pin_is_retried_and_a_lost_unpin_is_not(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 384)
    ids = rng.integers(0, 2**32, 384, dtype=np.uint64).tolist()
    for layer in range(4):
        client.append(s, layer, keys, values, token_ids=ids)  # 2 pages a layer
    client.release(s)
    proxy.lose["Pin"] = 1
    r = client.pin("lost-pin", ids, ttl_seconds=30)
    assert proxy.calls["Pin"] == 2 and client.retries == 1
    assert (r.pages_pinned, r.replaced) == (8, True)  # the lost answer's pin was made; the repeat replaced it
    proxy.lose["Unpin"] = 1
    with pytest.raises(driftkv.DriftkvError) as e:
        client.unpin("lost-pin")
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert proxy.calls["Unpin"] == 1 and client.retries == 1
    with pytest.raises(driftkv.DriftkvError) as e:  # the lost answer's unpin was done
        client.unpin("lost-pin")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_read_only_calls_are_retried(client, proxy, rng):
    s = sid()
    keys, values = kv(rng, 5)
    client.append(s, 0, keys, values)
    for method, call in (("Length", lambda: client.length(s)), ("Info", client.info), ("Stats", client.stats)):
        proxy.lose[method] = 3
        call()
        assert proxy.calls[method] >= 4
    assert client.retries == 9
    proxy.lose["Stats"] = 4  # max_attempts 4: the fourth loss is the caller's
    with pytest.raises(driftkv.DriftkvError) as e:
        client.stats()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    client.release(s)


def test_other_errors_and_deadlines_are_not_retried(client, proxy):
    with pytest.raises(driftkv.DriftkvError) as e:
        client.length("ghost")
    assert e.value.code == grpc.StatusCode.NOT_FOUND and proxy.calls["Length"] == 1
    proxy.delay["Stats"] = 1.0
    with pytest.raises(driftkv.DriftkvError) as e:
        with driftkv.Client(proxy.target, timeout=0.2, retry=FAST) as c:
            c.stats()
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert proxy.calls["Stats"] == 1 and client.retries == 0


def test_backoff_doubles_with_jitter_up_to_the_cap():
    sleeps = list(driftkv.RetryPolicy(max_attempts=6, initial_backoff=0.02, max_backoff=0.1).sleeps(True))
    assert len(sleeps) == 6 and sleeps[0] == 0
    for got, cap in zip(sleeps[1:], (0.02, 0.04, 0.08, 0.1, 0.1)):
        assert cap / 2 <= got <= cap
    assert list(driftkv.RetryPolicy().sleeps(False)) == [0.0]
