"""driftkv.Client against a driftkv-server process: arrays in and out,
dtypes, shape checks, Length, channel limits, errors."""
import dataclasses
import uuid

import grpc
import numpy as np
import pytest

import driftkv
from conftest import exact_attention, kv
from driftkv._proto import pb, pb_grpc


def sid():
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def client(server):
    with driftkv.Client(server.target, timeout=20) as c:
        yield c


def test_info_and_stats_carry_every_proto_field(client):
    for cls, message in ((driftkv.Info, pb.InfoResponse), (driftkv.Stats, pb.StatsResponse)):
        assert {f.name for f in dataclasses.fields(cls)} == {f.name for f in message.DESCRIPTOR.fields}
    info = client.info()
    assert (info.layers, info.kv_heads, info.head_dim, info.page_tokens) == (4, 4, 128, 128)
    assert info.backend == "cpu" and info.codec == "dquant" and not info.hot_tier


def test_window_tokens_are_attended_exactly(client, rng):
    s = sid()
    keys, values = kv(rng, 200)  # < R + P = 256: all in the bf16 window
    r = client.append(s, 2, keys, values, chunk_tokens=64)
    assert r == driftkv.AppendResult(4, 200, 0)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    out, lse = client.attend(driftkv.AttendItem(s, 2, q))
    ref, ref_lse = exact_attention(q, keys, values)
    assert out.shape == (8, 128) and out.dtype == np.float32 and lse.shape == (8,)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    back = client.read(s, 2)
    assert back.compressed_tokens == 0
    np.testing.assert_array_equal(back.keys, keys)
    np.testing.assert_array_equal(back.values, values)
    client.release(s)


def test_batched_attend_stacks_items_and_reports_counts(client, rng):
    s = sid()
    keys, values = kv(rng, 600, scale=0.5)
    client.append(s, 0, keys, values)
    client.append(s, 1, keys[:10], values[:10])
    # Decode-like queries: each head looks for a few past keys (an average of
    # 3 keys of its KV head, scaled), so attention is sharp, as in a model.
    picks = rng.integers(0, 600, size=(3, 8, 3))
    qs = np.stack([np.stack([8 * keys[picks[i, h], h // 2].mean(0) for h in range(8)]) for i in range(3)])
    qs = qs.astype(np.float32)
    items = [driftkv.AttendItem(s, 0, qs[0]), driftkv.AttendItem(s, 1, qs[1]), driftkv.AttendItem(s, 0, qs[2])]
    out, lse = client.attend(items)
    assert out.shape == (3, 8, 128) and lse.shape == (3, 8)
    each = client.attend_results(items)
    assert [(r.tokens, r.compressed_tokens) for r in each] == [(600, 384), (10, 0), (600, 384)]
    np.testing.assert_array_equal(np.stack([r.output for r in each]), out)
    # Pages hold D-Quant records (~2.3 bits per value): attention on them is
    # exact attention over what Read reconstructs, not over the original
    # tokens (on i.i.d. Gaussian data, ~30% off at this rate).
    stored = client.read(s, 0)
    assert stored.compressed_tokens == 384
    for i in (0, 2):
        ref, ref_lse = exact_attention(qs[i], stored.keys, stored.values)
        np.testing.assert_allclose(out[i], ref, atol=2e-3 * np.abs(ref).max())
        np.testing.assert_allclose(lse[i], ref_lse, rtol=1e-4)
        orig, _ = exact_attention(qs[i], keys, values)
        assert np.linalg.norm(out[i] - orig) / np.linalg.norm(orig) < 0.5
    ref1, _ = exact_attention(qs[1], keys[:10], values[:10])
    np.testing.assert_allclose(out[1], ref1, atol=2e-5)
    client.release(s)


def test_every_wire_dtype_stores_the_same_bf16_tokens(client, rng):
    keys, values = kv(rng, 50, scale=0.25)
    ids = []
    for wire, k, v in (("f32", keys, values), ("fp16", keys, values), ("bf16", keys, values),
                       (None, keys.astype(np.float16), values.astype(np.float16)),
                       (None, keys.astype(np.float64), values.astype(np.float64))):
        ids.append(sid())
        client.append(ids[-1], 0, k, v, wire_dtype=wire)
    reads = [client.read(i, 0) for i in ids]
    for r in reads:
        np.testing.assert_array_equal(r.keys, keys)
        np.testing.assert_array_equal(r.values, values)
    half = client.read(ids[0], 0, first_token=10, token_count=5, wire_dtype="bf16")
    np.testing.assert_array_equal(half.keys, keys[10:15])
    for i in ids:
        client.release(i)


def test_torch_tensors_in_and_out(client, rng):
    torch = pytest.importorskip("torch")
    s = sid()
    keys, values = kv(rng, 100)
    client.append(s, 3, torch.from_numpy(keys).to(torch.bfloat16), torch.from_numpy(values).to(torch.bfloat16))
    q = torch.randn(8, 128)
    out, lse = client.attend([driftkv.AttendItem(s, 3, q)])
    assert isinstance(out, torch.Tensor) and out.shape == (1, 8, 128) and out.dtype == torch.float32
    ref, _ = exact_attention(q.numpy(), keys, values)
    np.testing.assert_allclose(out[0].numpy(), ref, atol=2e-5)
    o2, l2 = driftkv.merge_attention(out, lse, out, lse)  # merging a part with itself changes nothing
    torch.testing.assert_close(o2, out)
    torch.testing.assert_close(l2, lse + np.log(2.0))
    client.release(s)


def test_shape_mismatch_is_rejected_naming_the_field(client, rng):
    s = sid()
    keys, values = kv(rng, 20)
    client.append(s, 0, keys, values)
    # 8 heads x 64: the same bytes as 4 x 128.
    with pytest.raises(driftkv.DriftkvError) as e:
        client.append(s, 0, keys.reshape(20, 8, 64), values.reshape(20, 8, 64), first_token=20)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv_heads 8 does not match the server's kv_heads 4" in e.value.details
    q = rng.standard_normal((16, 64)).astype(np.float32)  # 8 x 128 as 16 x 64
    with pytest.raises(driftkv.DriftkvError) as e:
        client.attend(driftkv.AttendItem(s, 0, q))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details == "items[0].head_dim 64 does not match the server's head_dim 128"
    # What the client can tell by itself.
    with pytest.raises(driftkv.DriftkvError, match=r"keys has shape \(20, 512\)"):
        client.append(s, 0, keys.reshape(20, 512), values.reshape(20, 512))
    with pytest.raises(driftkv.DriftkvError, match="wire_dtype 'int8'"):
        client.append(s, 0, keys, values, wire_dtype="int8")
    assert client.length(s)[0].tokens == 20
    client.release(s)


def test_length_reports_what_a_partly_failed_stream_stored(client, rng):
    s = sid()
    keys, values = kv(rng, 500)
    bad = values.copy()
    bad[350, 1, 7] = np.nan
    chunks = [driftkv.Chunk(s, 1, t, keys[t:t + 100], (bad if t == 300 else values)[t:t + 100])
              for t in range(0, 500, 100)]
    seen = []
    with pytest.raises(driftkv.DriftkvError) as e:
        client.append_chunks(chunks, progress=lambda n, tokens: seen.append((n, tokens)))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details.startswith("chunk 3 of the stream (3 accepted before it): values element 25735 is nan")
    assert seen[:3] == [(1, 100), (2, 200), (3, 300)]
    lengths = client.length(s)
    assert lengths[1] == driftkv.LayerLength(300, 128, 172)  # R = P = 128: one page, 172 in the window
    assert [l.tokens for l in lengths] == [0, 300, 0, 0]
    # Resume where Length says.
    r = client.append(s, 1, keys[300:], values[300:], first_token=lengths[1].tokens)
    assert r.tokens_stored == 200
    assert client.length(s)[1] == driftkv.LayerLength(500, 256, 244)
    with pytest.raises(driftkv.DriftkvError) as e:
        client.length("no-such-sequence")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    client.release(s)


def test_an_iterator_that_fails_keeps_the_chunks_before_it(client, rng):
    s = sid()
    keys, values = kv(rng, 30)

    def chunks():
        yield driftkv.Chunk(s, 0, 0, keys[:10], values[:10])
        yield driftkv.Chunk(s, 0, 10, keys[10:20], values[10:20])
        raise RuntimeError("the prefill crashed")

    with pytest.raises(RuntimeError, match="the prefill crashed"):
        client.append_chunks(chunks())
    assert client.length(s)[0].tokens == 20
    client.release(s)


def test_prefetch_without_a_disk_level_restores_nothing(client, rng):
    s = sid()
    keys, values = kv(rng, 200)
    client.append(s, 0, keys, values)
    assert client.prefetch(s) == 0
    with pytest.raises(driftkv.DriftkvError) as e:
        client.prefetch(sid())
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    client.release(s)


def test_length_is_the_same_in_either_tier(hot_server, rng):
    with driftkv.Client(hot_server.target) as c:
        assert c.info().hot_tier
        s = sid()
        keys, values = kv(rng, 700, scale=0.5)
        c.append(s, 0, keys, values)
        before = c.length(s)
        assert before[0] == driftkv.LayerLength(700, 512, 188)
        c.attend(driftkv.AttendItem(s, 0, rng.standard_normal((8, 128)).astype(np.float32)))  # promotes (sync)
        assert c.stats().hot_pages_in_use == 4
        assert c.length(s) == before
        c.release(s)


def test_fork_then_the_rest_answers_as_a_fresh_sequence(client, rng):
    s, f, w = sid(), sid(), sid()
    keys, values = kv(rng, 700)
    more_k, more_v = kv(rng, 700)
    for layer in range(4):
        client.append(s, layer, keys[:600], values[:600])  # 3 pages of 128 per layer
    pages = client.stats().pages_in_use
    assert client.fork(s, f, 256) == driftkv.ForkResult([driftkv.LayerLength(256, 256, 0)] * 4, 8, 256)
    assert client.stats().pages_in_use == pages  # shared, not copied
    # The fork's own continuation after the shared prefix.
    want_k, want_v = np.concatenate([keys[:256], more_k[256:]]), np.concatenate([values[:256], more_v[256:]])
    q = rng.standard_normal((8, 128)).astype(np.float32)
    for layer in range(4):
        client.append(f, layer, want_k[256:], want_v[256:], first_token=256)
        client.append(w, layer, want_k, want_v)
        got, fresh = client.read(f, layer), client.read(w, layer)
        np.testing.assert_array_equal(got.keys, fresh.keys)
        np.testing.assert_array_equal(got.values, fresh.values)
        assert got.compressed_tokens == fresh.compressed_tokens == 512
        a, b = client.attend(driftkv.AttendItem(f, layer, q)), client.attend(driftkv.AttendItem(w, layer, q))
        np.testing.assert_array_equal(a.output, b.output)
        np.testing.assert_array_equal(a.lse, b.lse)
    assert client.length(f) == client.length(w)
    for x in (s, f, w):
        client.release(x)


def test_fork_refusals(client, rng):
    s = sid()
    keys, values = kv(rng, 300)
    for layer in range(4):
        client.append(s, layer, keys, values)  # 1 page per layer
    for args, code, details in (
            (("ghost", "x", 128), grpc.StatusCode.NOT_FOUND, 'source_sequence_id "ghost" not found'),
            ((s, "x", 100), grpc.StatusCode.INVALID_ARGUMENT,
             "tokens 100 is not a positive multiple of page_tokens 128; a fork shares whole pages "
             "(append the rest to it)"),
            ((s, "x", 256), grpc.StatusCode.INVALID_ARGUMENT,
             f'tokens 256 exceeds the 128 paged tokens of layer 0 of source_sequence_id "{s}"; only tokens in '
             "full pages are shared (the bf16 window's are not)"),
            ((s, s, 128), grpc.StatusCode.INVALID_ARGUMENT,
             f'sequence_id "{s}" is also the source_sequence_id; a fork needs a new id'),
            ((s, "x", 0), grpc.StatusCode.INVALID_ARGUMENT, "tokens 0 out of range [1, 18446744073709551615]"),
            ((s, 7, 128), grpc.StatusCode.INVALID_ARGUMENT, "sequence_id is 7; expected a str")):
        with pytest.raises(driftkv.DriftkvError) as e:
            client.fork(*args)
        assert (e.value.code, e.value.details) == (code, details)
    assert client.stats().sequences >= 1 and [l.tokens for l in client.length(s)] == [300] * 4
    with pytest.raises(driftkv.DriftkvError) as e:
        client.length("x")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    client.release(s)


def test_maximum_size_attend_fits_the_channel_sized_from_info(client, server, rng):
    s = sid()
    keys, values = kv(rng, 5)
    client.append(s, 0, keys, values)
    assert client.max_message_bytes == client.info().max_message_bytes == 64 << 20
    q = rng.standard_normal((8, 128)).astype(np.float32)
    items = [driftkv.AttendItem(s, 0, q)] * client.server_info.max_batch  # 1024 items: a 4.2 MB answer
    out, lse = client.attend(items)
    assert out.shape == (1024, 8, 128)
    np.testing.assert_array_equal(out[0], out[-1])
    # gRPC's default 4 MiB receive limit could not take it.
    req = pb.AttendRequest(items=[pb.AttendItem(sequence_id=s, layer=0, dtype=pb.DTYPE_F32, q_heads=8,
                                                query=q.tobytes())] * 1024)
    with grpc.insecure_channel(server.target) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.KvCacheStub(ch).Attend(req, timeout=20)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(driftkv.DriftkvError, match="max_batch is 1024"):
        client.attend(items + items[:1])
    client.release(s)


def test_errors_carry_code_and_message(client, rng):
    with pytest.raises(driftkv.DriftkvError) as e:
        client.attend(driftkv.AttendItem("ghost", 0, np.zeros((8, 128), np.float32)))
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert e.value.details == 'items[0].sequence_id "ghost" not found'
    assert str(e.value) == 'NOT_FOUND: items[0].sequence_id "ghost" not found'
    with pytest.raises(driftkv.DriftkvError) as e:
        client.attend(driftkv.AttendItem("ghost", 9, np.zeros((8, 128), np.float32)))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(driftkv.DriftkvError, match="new_key and new_value go together"):
        client.attend(driftkv.AttendItem("x", 0, np.zeros((8, 128), np.float32), new_key=np.zeros((4, 128))))
    with pytest.raises(driftkv.DriftkvError) as e:
        driftkv.Client("127.0.0.1:1", timeout=0.5, retry=driftkv.RetryPolicy(max_attempts=1)).info()
    assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert client.retries == 0


def test_decode_steps_append_then_attend(client, rng):
    s = sid()
    keys, values = kv(rng, 64)
    client.append(s, 0, keys[:60], values[:60])
    for t in range(60, 64):
        q = rng.standard_normal((8, 128)).astype(np.float32)
        out, lse = client.attend(driftkv.AttendItem(s, 0, q, new_key=keys[t], new_value=values[t],
                                                    new_token_index=t))
        ref, ref_lse = exact_attention(q, keys[:t + 1], values[:t + 1])
        np.testing.assert_allclose(out, ref, atol=2e-5)
    # A repeated index is acknowledged, not stored twice.
    client.attend(driftkv.AttendItem(s, 0, q, new_key=keys[63], new_value=values[63], new_token_index=63))
    assert client.length(s)[0].tokens == 64
    client.release(s)
