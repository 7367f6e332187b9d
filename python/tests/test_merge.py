"""merge_attention: the log-sum-exp merge of two partial attentions."""
import uuid

import numpy as np
import pytest

import driftkv
from conftest import exact_attention, kv


def test_merge_of_two_halves_is_the_whole(rng):
    keys, values = kv(rng, 90)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    o1, l1 = exact_attention(q, keys[:30], values[:30])
    o2, l2 = exact_attention(q, keys[30:], values[30:])
    o, lse = driftkv.merge_attention(o1, l1, o2, l2)
    ref, ref_lse = exact_attention(q, keys, values)
    assert o.dtype == np.float32 and o.shape == (8, 128) and lse.shape == (8,)
    np.testing.assert_allclose(o, ref, atol=1e-6)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    # Batched: leading axes broadcast.
    ob, lb = driftkv.merge_attention(np.stack([o1, o1]), np.stack([l1, l1]), np.stack([o2, o2]), np.stack([l2, l2]))
    np.testing.assert_allclose(ob[1], ref, atol=1e-6)


def test_an_empty_part_merges_to_nothing(rng):
    o1 = rng.standard_normal((2, 4)).astype(np.float32)
    l1 = np.array([0.5, -3.0], np.float32)
    empty_o, empty_l = np.zeros((2, 4), np.float32), np.full(2, -np.inf, np.float32)
    o, lse = driftkv.merge_attention(o1, l1, empty_o, empty_l)
    np.testing.assert_array_equal(o, o1)
    np.testing.assert_array_equal(lse, l1)
    o, lse = driftkv.merge_attention(empty_o, empty_l, empty_o, empty_l)
    assert (o == 0).all() and (lse == -np.inf).all()


def test_merge_in_torch(rng):
    torch = pytest.importorskip("torch")
    keys, values = kv(rng, 40)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    parts = [exact_attention(q, keys[a:b], values[a:b]) for a, b in ((0, 25), (25, 40))]
    t = [torch.tensor(x, dtype=torch.float32) for p in parts for x in p]
    o, lse = driftkv.merge_attention(*t)
    ref, ref_lse = exact_attention(q, keys, values)
    np.testing.assert_allclose(o.numpy(), ref, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-6)


def test_server_tokens_merged_with_tokens_held_by_the_caller(server, rng):
    """A decode worker attends driftkv's stored tokens and its own newest
    ones, and merges: the same as attention over all of them."""
    s = "m-" + uuid.uuid4().hex[:12]
    keys, values = kv(rng, 150)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    with driftkv.Client(server.target) as c:
        c.append(s, 1, keys[:120], values[:120])
        o1, l1 = c.attend(driftkv.AttendItem(s, 1, q))
        c.release(s)
    o2, l2 = exact_attention(q, keys[120:], values[120:])
    o, lse = driftkv.merge_attention(o1, l1, o2, l2)
    ref, ref_lse = exact_attention(q, keys, values)
    np.testing.assert_allclose(o, ref, atol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
