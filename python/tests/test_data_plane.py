"""The Python client on the data plane: attend by reference to a registered
host region gives exactly the inline answers (f32 and bf16 outputs, decode
steps too), out=/lse= are filled in place, the AttendStream and the doorbell
answer what the unary call answers, and their errors carry the server's
code and message."""

import grpc
import numpy as np
import pytest

import driftkv
from driftkv import AttendItem
from driftkv._errors import DriftkvError
from driftkv._proto import pb
from driftkv._tensors import bf16_bits_to_f32, f32_to_bf16_bits

from conftest import kv, region_socket_server

Q_HEADS, HEAD_DIM, TOKENS = 8, 128, 300  # 300 tokens: two pages and a window


@pytest.fixture(scope="module")
def dp_server():
    with region_socket_server("dp") as s:
        yield s


@pytest.fixture
def client(dp_server):
    with driftkv.Client(dp_server.target, timeout=20) as c:
        yield c


@pytest.fixture
def region(client):
    r = client.register_host_region(4 << 20, name="pytest-dp")
    yield r
    r.close()


def stored(client, rng, name, layers=(0, 1)):
    keys, values = kv(rng, TOKENS)
    for layer in layers:
        client.append(name, layer, keys, values)
    return keys, values


def queries(rng, n):
    return rng.standard_normal((n, Q_HEADS, HEAD_DIM)).astype(np.float32)


def in_region(region, a):
    view = region.alloc(a.shape, a.dtype)
    view[...] = a
    return view


def test_by_reference_is_bit_identical_to_inline_f32(client, region, rng):
    stored(client, rng, "dp-f32")
    q = queries(rng, 3)
    inline = client.attend([AttendItem("dp-f32", i % 2, q[i]) for i in range(3)])
    q_ref = in_region(region, q)
    out = region.alloc((3, Q_HEADS, HEAD_DIM), np.float32)
    lse = region.alloc((3, Q_HEADS), np.float32)
    out[...] = np.nan
    lse[...] = np.nan
    items = [AttendItem("dp-f32", i % 2, q_ref[i]) for i in range(3)]
    req, _, _ = client.prepare_attend(items, out=out, lse=lse)
    assert all(m.HasField("query_ref") and not m.query for m in req.items)
    assert all(m.HasField("output_ref") and m.HasField("lse_ref") for m in req.items)
    assert req.items[1].query_ref.offset - req.items[0].query_ref.offset == Q_HEADS * HEAD_DIM * 4
    got = client.attend(items, out=out, lse=lse)
    assert got.output is out and got.lse is lse
    np.testing.assert_array_equal(out, inline.output)
    np.testing.assert_array_equal(lse, inline.lse)


def test_by_reference_is_bit_identical_to_inline_bf16(client, region, rng):
    stored(client, rng, "dp-bf16", layers=(0,))
    q = queries(rng, 2)
    items = [AttendItem("dp-bf16", 0, q[i]) for i in range(2)]
    f32 = client.attend(items)
    inline = client.attend(items, output_dtype="bf16")
    assert inline.output.dtype == np.float32
    # The server rounds its float32 answer to nearest even, as the client does.
    np.testing.assert_array_equal(f32_to_bf16_bits(inline.output), f32_to_bf16_bits(f32.output))
    np.testing.assert_array_equal(inline.lse, f32.lse)
    out = region.alloc((2, Q_HEADS, HEAD_DIM), np.uint16)
    lse = region.alloc((2, Q_HEADS), np.float32)
    q_ref = in_region(region, q)
    ref_items = [AttendItem("dp-bf16", 0, q_ref[i]) for i in range(2)]
    req, _, _ = client.prepare_attend(ref_items, out=out, lse=lse)
    assert req.items[0].output_dtype == pb.DTYPE_BF16 and req.items[0].HasField("output_ref")
    client.attend(ref_items, out=out, lse=lse)
    np.testing.assert_array_equal(bf16_bits_to_f32(out), inline.output)
    np.testing.assert_array_equal(lse, inline.lse)
    # A bf16 destination outside any region gets the same bits inline.
    plain = np.zeros((2, Q_HEADS, HEAD_DIM), np.uint16)
    client.attend(items, out=plain, lse=np.zeros((2, Q_HEADS), np.float32))
    np.testing.assert_array_equal(plain, out)


def test_out_arrays_outside_regions_are_filled_in_place(client, rng):
    stored(client, rng, "dp-plain", layers=(0,))
    q = queries(rng, 1)[0]
    want = client.attend(AttendItem("dp-plain", 0, q))
    out = np.full((Q_HEADS, HEAD_DIM), np.nan, np.float32)
    lse = np.full((Q_HEADS,), np.nan, np.float32)
    got = client.attend(AttendItem("dp-plain", 0, q), out=out, lse=lse)
    assert got.output is out and got.lse is lse
    np.testing.assert_array_equal(out, want.output)
    np.testing.assert_array_equal(lse, want.lse)
    with pytest.raises(DriftkvError) as e:
        client.attend(AttendItem("dp-plain", 0, q), out=out)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "both or neither" in e.value.details


def test_a_decode_step_by_reference_stores_what_inline_stores(client, region, rng):
    keys, values = kv(rng, TOKENS)
    for name in ("dp-step-a", "dp-step-b"):
        client.append(name, 0, keys, values)
    nk, nv = kv(rng, 1)
    q = queries(rng, 1)[0]
    inline = client.attend(AttendItem("dp-step-a", 0, q, nk[0], nv[0], new_token_index=TOKENS))
    k_ref, v_ref, q_ref = in_region(region, nk[0]), in_region(region, nv[0]), in_region(region, q)
    item = AttendItem("dp-step-b", 0, q_ref, k_ref, v_ref, new_token_index=TOKENS)
    req, idempotent, _ = client.prepare_attend(item)
    assert idempotent and req.items[0].HasField("new_key_ref") and req.items[0].HasField("new_value_ref")
    by_ref = client.attend(item)
    np.testing.assert_array_equal(by_ref.output, inline.output)
    np.testing.assert_array_equal(by_ref.lse, inline.lse)
    assert client.length("dp-step-a")[0] == client.length("dp-step-b")[0]
    assert client.length("dp-step-b")[0].tokens == TOKENS + 1


def test_torch_cpu_tensors_in_a_region_go_by_reference(client, region, rng):
    torch = pytest.importorskip("torch")
    stored(client, rng, "dp-torch", layers=(0,))
    q = queries(rng, 1)[0]
    want = client.attend(AttendItem("dp-torch", 0, q))
    tq = torch.from_numpy(in_region(region, q))
    out = torch.from_numpy(region.alloc((Q_HEADS, HEAD_DIM), np.float32))
    lse = torch.from_numpy(region.alloc((Q_HEADS,), np.float32))
    req, _, _ = client.prepare_attend(AttendItem("dp-torch", 0, tq), out=out, lse=lse)
    assert req.items[0].HasField("query_ref") and req.items[0].HasField("output_ref")
    client.attend(AttendItem("dp-torch", 0, tq), out=out, lse=lse)
    np.testing.assert_array_equal(out.numpy(), want.output)
    np.testing.assert_array_equal(lse.numpy(), want.lse)


def test_the_stream_answers_what_the_unary_call_answers(client, region, rng):
    stored(client, rng, "dp-stream")
    q = queries(rng, 4)
    q_ref = in_region(region, q)
    out = region.alloc((2, Q_HEADS, HEAD_DIM), np.float32)
    lse = region.alloc((2, Q_HEADS), np.float32)
    with client.attend_stream() as stream:
        for layer in (0, 1):
            items = [AttendItem("dp-stream", layer, q[2 * layer + i]) for i in range(2)]
            want = client.attend(items)
            got = stream.attend(items, timeout=5.0)
            np.testing.assert_array_equal(got.output, want.output)
            np.testing.assert_array_equal(got.lse, want.lse)
            ref_items = [AttendItem("dp-stream", layer, q_ref[2 * layer + i]) for i in range(2)]
            assert stream.attend(ref_items, out=out, lse=lse).output is out
            np.testing.assert_array_equal(out, want.output)
            np.testing.assert_array_equal(lse, want.lse)
        req, _, _ = client.prepare_attend([AttendItem("dp-stream", 0, q[0])])
        raw = stream.attend(req)
        assert isinstance(raw, pb.AttendResponse) and raw == client._connect().Attend(req)


def unknown_region_request():
    req = pb.AttendRequest()
    m = req.items.add(sequence_id="dp-none", layer=0, dtype=pb.DTYPE_F32, q_heads=Q_HEADS, head_dim=HEAD_DIM)
    m.query_ref.region_id = 12345
    return req


def test_stream_errors_carry_the_servers_status_and_leave_it_usable(client, rng):
    stored(client, rng, "dp-stream-err", layers=(0,))
    q = queries(rng, 1)[0]
    with pytest.raises(DriftkvError) as unary:
        client.attend(unknown_region_request())
    assert unary.value.code == grpc.StatusCode.NOT_FOUND
    assert "query_ref.region_id 12345 not found" in unary.value.details
    with pytest.raises(DriftkvError) as missing:
        client.attend(AttendItem("dp-no-such-sequence", 0, q))
    with client.attend_stream() as stream:
        for request, want in ((unknown_region_request(), unary.value),
                              (AttendItem("dp-no-such-sequence", 0, q), missing.value)):
            with pytest.raises(DriftkvError) as e:
                stream.attend(request)
            assert (e.value.code, e.value.details) == (want.code, want.details)
        np.testing.assert_array_equal(stream.attend(AttendItem("dp-stream-err", 0, q)).output,
                                      client.attend(AttendItem("dp-stream-err", 0, q)).output)
    with pytest.raises(DriftkvError) as closed:
        stream.attend(AttendItem("dp-stream-err", 0, q))
    assert closed.value.code == grpc.StatusCode.UNAVAILABLE


def test_the_doorbell_answers_what_the_unary_call_answers(client, region, rng):
    stored(client, rng, "dp-bell")
    q = queries(rng, 2)
    q_ref = in_region(region, q)
    out = region.alloc((Q_HEADS, HEAD_DIM), np.float32)
    lse = region.alloc((Q_HEADS,), np.float32)
    with client.open_doorbell(region, request_capacity=64 << 10, response_capacity=256 << 10) as bell:
        for layer in (0, 1):
            want = client.attend(AttendItem("dp-bell", layer, q[layer]))
            got = bell.attend(AttendItem("dp-bell", layer, q[layer]), timeout=5.0)
            np.testing.assert_array_equal(got.output, want.output)
            np.testing.assert_array_equal(got.lse, want.lse)
            bell.attend(AttendItem("dp-bell", layer, q_ref[layer]), out=out, lse=lse)
            np.testing.assert_array_equal(out, want.output)
            np.testing.assert_array_equal(lse, want.lse)
        with pytest.raises(DriftkvError) as unary:
            client.attend(unknown_region_request())
        with pytest.raises(DriftkvError) as e:
            bell.attend(unknown_region_request())
        assert (e.value.code, e.value.details) == (unary.value.code, unary.value.details)
        # Idle past the server's spin: it sleeps on the futex and is woken.
        import time
        time.sleep(0.2)
        np.testing.assert_array_equal(bell.attend(AttendItem("dp-bell", 0, q[0])).output,
                                      client.attend(AttendItem("dp-bell", 0, q[0])).output)


def test_the_sharded_client_passes_destinations_through(client, region, rng):
    stored(client, rng, "dp-sharded", layers=(0,))
    q = queries(rng, 2)
    items = [AttendItem("dp-sharded", 0, q[i]) for i in range(2)]
    want = client.attend(items, output_dtype="bf16")
    out = region.alloc((2, Q_HEADS, HEAD_DIM), np.uint16)
    lse = region.alloc((2, Q_HEADS), np.float32)
    sharded = driftkv.ShardedClient([client.target], clients=[client])
    got = sharded.attend(items, out=out, lse=lse)
    assert got.output is out
    np.testing.assert_array_equal(bf16_bits_to_f32(out), want.output)
    np.testing.assert_array_equal(lse, want.lse)
    each = sharded.attend_results(items, output_dtype="bf16")
    np.testing.assert_array_equal(np.stack([r.output for r in each]), want.output)


def test_prepared_doorbell_requests_decode_as_inline_attends_do(client, region, rng):
    # "dp-prep" by prepared requests (everything in the region), "dp-twin"
    # (the same tokens) by inline Attends with the same decode steps: the
    # same bits, step after step.
    keys, values = stored(client, rng, "dp-prep")
    for layer in (0, 1):
        client.append("dp-twin", layer, keys, values)
    kv_heads = keys.shape[1]
    q = region.alloc((2, Q_HEADS, HEAD_DIM), np.float32)
    nk = region.alloc((2, kv_heads, HEAD_DIM), np.float32)
    nv = region.alloc((2, kv_heads, HEAD_DIM), np.float32)
    out = region.alloc((2, Q_HEADS, HEAD_DIM), np.float32)
    lse = region.alloc((2, Q_HEADS), np.float32)
    with client.open_doorbell(region, request_capacity=64 << 10, response_capacity=64 << 10) as bell:
        for layer in (0, 1):
            bell.prepare(layer, AttendItem("dp-prep", layer, q[layer], new_key=nk[layer], new_value=nv[layer],
                                           new_token_index=TOKENS), out=out[layer], lse=lse[layer])
        for step in range(4):
            for layer in (0, 1):
                q[layer] = rng.standard_normal((Q_HEADS, HEAD_DIM)).astype(np.float32)
                nk[layer] = rng.standard_normal((kv_heads, HEAD_DIM)).astype(np.float32)
                nv[layer] = rng.standard_normal((kv_heads, HEAD_DIM)).astype(np.float32)
                got = bell.attend_prepared(layer, step, timeout=5.0)
                assert got.output is out[layer] or np.shares_memory(got.output, out)
                want = client.attend(AttendItem("dp-twin", layer, q[layer].copy(), new_key=nk[layer].copy(),
                                                new_value=nv[layer].copy(), new_token_index=TOKENS + step))
                np.testing.assert_array_equal(out[layer], want.output)
                np.testing.assert_array_equal(lse[layer], want.lse)
        assert client.length("dp-prep")[1].tokens == TOKENS + 4
        # Inline tensors cannot be prepared; an empty slot is NOT_FOUND; a
        # slot out of range is refused before anything is sent.
        with pytest.raises(DriftkvError) as inline:
            bell.prepare(5, AttendItem("dp-prep", 0, queries(rng, 1)[0]))
        assert inline.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "is inline; a prepared request names its tensors by reference" in inline.value.details
        with pytest.raises(DriftkvError) as empty:
            bell.attend_prepared(5)
        assert (empty.value.code, empty.value.details) == (grpc.StatusCode.NOT_FOUND,
                                                           "doorbell prepared slot 5 is empty")
        with pytest.raises(DriftkvError) as bad:
            bell.attend_prepared(1024)
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
