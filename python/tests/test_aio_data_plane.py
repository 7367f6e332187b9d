"""driftkv.aio.Client on the data plane: attend by reference to a host
region registered from an event loop gives exactly the inline answers
(f32 and bf16 outputs, decode steps, concurrent calls, through
driftkv.aio.ShardedClient too), out=/lse= are filled in place, and a bad
reference fails with the same code and message as through the sync
client. (Torch CUDA tensors need a GPU and driftkv-server-cuda:
tests/gpu_check_cuda_tensors.py.)"""
import asyncio
import uuid

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from driftkv import AttendItem
from driftkv._errors import DriftkvError
from driftkv._proto import pb
from driftkv._tensors import bf16_bits_to_f32, f32_to_bf16_bits
from driftkv import regions as R

from conftest import kv, region_socket_server

Q_HEADS, HEAD_DIM, TOKENS = 8, 128, 300  # 300 tokens: two pages and a window
REGION_BYTES = 1 << 20


@pytest.fixture(scope="module")
def aio_dp_server():
    with region_socket_server("aio-dp") as s:
        yield s


@pytest.fixture
def sync_client(aio_dp_server):
    with driftkv.Client(aio_dp_server.target, timeout=20) as c:
        yield c


def run(aio_dp_server, body):
    """asyncio.run(body(client)) with a fresh aio client (one per loop)."""
    async def main():
        async with driftkv.aio.Client(aio_dp_server.target, timeout=20) as c:
            return await body(c)
    return asyncio.run(main())


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def queries(rng, n):
    return rng.standard_normal((n, Q_HEADS, HEAD_DIM)).astype(np.float32)


def in_region(region, a):
    view = region.alloc(a.shape, a.dtype)
    view[...] = a
    return view


def test_by_reference_is_bit_identical_to_inline_f32(aio_dp_server, sync_client, rng):
    seq = name("aio-f32")
    keys, values = kv(rng, TOKENS)
    q = queries(rng, 3)

    async def body(c):
        for layer in (0, 1):
            await c.append(seq, layer, keys, values)
        items = [AttendItem(seq, i % 2, q[i]) for i in range(3)]
        inline = await c.attend(items)
        async with await c.register_host_region(REGION_BYTES, name="pytest-aio") as region:
            q_ref = in_region(region, q)
            out = region.alloc((3, Q_HEADS, HEAD_DIM), np.float32)
            lse = region.alloc((3, Q_HEADS), np.float32)
            out[...] = np.nan
            lse[...] = np.nan
            ref_items = [AttendItem(seq, i % 2, q_ref[i]) for i in range(3)]
            req, idempotent, _ = await c.prepare_attend(ref_items, out=out, lse=lse)
            assert idempotent
            assert all(m.HasField("query_ref") and not m.query for m in req.items)
            assert all(m.HasField("output_ref") and m.HasField("lse_ref") for m in req.items)
            assert [m.query_ref.region_id for m in req.items] == [region.id] * 3
            got = await c.attend(ref_items, out=out, lse=lse)
            assert got.output is out and got.lse is lse
            return inline, out.copy(), lse.copy()

    inline, out, lse = run(aio_dp_server, body)
    np.testing.assert_array_equal(out, inline.output)
    np.testing.assert_array_equal(lse, inline.lse)
    # The sync client's inline answer is the same bits too.
    sync = sync_client.attend([AttendItem(seq, i % 2, q[i]) for i in range(3)])
    np.testing.assert_array_equal(sync.output, out)
    np.testing.assert_array_equal(sync.lse, lse)


def test_by_reference_is_bit_identical_to_inline_bf16(aio_dp_server, rng):
    seq = name("aio-bf16")
    keys, values = kv(rng, TOKENS)
    q = queries(rng, 2)

    async def body(c):
        await c.append(seq, 0, keys, values)
        items = [AttendItem(seq, 0, q[i]) for i in range(2)]
        f32 = await c.attend(items)
        inline = await c.attend(items, output_dtype="bf16")
        assert inline.output.dtype == np.float32
        np.testing.assert_array_equal(f32_to_bf16_bits(inline.output), f32_to_bf16_bits(f32.output))
        region = await c.register_host_region(REGION_BYTES, name="pytest-aio-bf16")
        try:
            out = region.alloc((2, Q_HEADS, HEAD_DIM), np.uint16)  # bf16 bits: output_dtype bf16
            lse = region.alloc((2, Q_HEADS), np.float32)
            ref_items = [AttendItem(seq, 0, v) for v in in_region(region, q)]
            req, _, _ = await c.prepare_attend(ref_items, out=out, lse=lse)
            assert req.items[0].output_dtype == pb.DTYPE_BF16 and req.items[0].HasField("output_ref")
            await c.attend(ref_items, out=out, lse=lse)
            # A bf16 destination outside any region gets the same bits inline.
            plain = np.zeros((2, Q_HEADS, HEAD_DIM), np.uint16)
            plain_lse = np.zeros((2, Q_HEADS), np.float32)
            await c.attend(items, out=plain, lse=plain_lse)
            results = await c.attend_results(ref_items, output_dtype="bf16")
            return inline, out.copy(), lse.copy(), plain, plain_lse, results
        finally:
            await region.aclose()

    inline, out, lse, plain, plain_lse, results = run(aio_dp_server, body)
    np.testing.assert_array_equal(bf16_bits_to_f32(out), inline.output)
    np.testing.assert_array_equal(lse, inline.lse)
    np.testing.assert_array_equal(plain, out)
    np.testing.assert_array_equal(plain_lse, lse)
    np.testing.assert_array_equal(np.stack([r.output for r in results]), inline.output)
    assert [r.tokens for r in results] == [TOKENS, TOKENS]


def test_a_decode_step_by_reference_stores_what_inline_stores(aio_dp_server, rng):
    a, b = name("aio-step-a"), name("aio-step-b")
    keys, values = kv(rng, TOKENS)
    nk, nv = kv(rng, 1)
    q = queries(rng, 1)[0]

    async def body(c):
        for s in (a, b):
            await c.append(s, 0, keys, values)
        inline = await c.attend(AttendItem(a, 0, q, nk[0], nv[0], new_token_index=TOKENS))
        async with await c.register_host_region(REGION_BYTES, name="pytest-aio-step") as region:
            item = AttendItem(b, 0, in_region(region, q), in_region(region, nk[0]), in_region(region, nv[0]),
                              new_token_index=TOKENS)
            req, idempotent, _ = await c.prepare_attend(item)
            assert idempotent and req.items[0].HasField("new_key_ref") and req.items[0].HasField("new_value_ref")
            assert not req.items[0].new_key and not req.items[0].new_value
            by_ref = await c.attend(item)
        return inline, by_ref, await c.length(a), await c.length(b)

    inline, by_ref, len_a, len_b = run(aio_dp_server, body)
    np.testing.assert_array_equal(by_ref.output, inline.output)
    np.testing.assert_array_equal(by_ref.lse, inline.lse)
    assert len_a[0] == len_b[0] and len_b[0].tokens == TOKENS + 1


def test_concurrent_calls_fill_their_own_rows(aio_dp_server, rng):
    """Eight attends in flight at once, each writing its row of one out/lse
    pair by reference; the first registration of the region happens from
    the loop while nothing else blocks."""
    seq = name("aio-many")
    keys, values = kv(rng, TOKENS)
    q = queries(rng, 8)

    async def body(c):
        await c.append(seq, 0, keys, values)
        inline = await c.attend([AttendItem(seq, 0, v) for v in q])
        async with await c.register_host_region(REGION_BYTES, name="pytest-aio-many") as region:
            q_ref = in_region(region, q)
            out = region.alloc((8, Q_HEADS, HEAD_DIM), np.float32)
            lse = region.alloc((8, Q_HEADS), np.float32)
            got = await asyncio.gather(*(c.attend(AttendItem(seq, 0, q_ref[i]), out=out[i], lse=lse[i])
                                         for i in range(8)))
            assert all(np.shares_memory(g.output, out) and np.shares_memory(g.lse, lse) for g in got)
            return inline, out.copy(), lse.copy()

    inline, out, lse = run(aio_dp_server, body)
    np.testing.assert_array_equal(out, inline.output)
    np.testing.assert_array_equal(lse, inline.lse)


def test_torch_cpu_tensors_in_a_region_go_by_reference(aio_dp_server, rng):
    torch = pytest.importorskip("torch")
    seq = name("aio-torch")
    keys, values = kv(rng, TOKENS)
    q = queries(rng, 1)[0]

    async def body(c):
        await c.append(seq, 0, keys, values)
        want = await c.attend(AttendItem(seq, 0, q))
        async with await c.register_host_region(REGION_BYTES, name="pytest-aio-torch") as region:
            tq = torch.from_numpy(in_region(region, q))
            out = torch.from_numpy(region.alloc((Q_HEADS, HEAD_DIM), np.float32))
            lse = torch.from_numpy(region.alloc((Q_HEADS,), np.float32))
            req, _, _ = await c.prepare_attend(AttendItem(seq, 0, tq), out=out, lse=lse)
            assert req.items[0].HasField("query_ref") and req.items[0].HasField("output_ref")
            await c.attend(AttendItem(seq, 0, tq), out=out, lse=lse)
            return want, out.numpy().copy(), lse.numpy().copy()

    want, out, lse = run(aio_dp_server, body)
    np.testing.assert_array_equal(out, want.output)
    np.testing.assert_array_equal(lse, want.lse)


def test_the_aio_sharded_client_passes_destinations_through(aio_dp_server, rng):
    seq = name("aio-sharded")
    keys, values = kv(rng, TOKENS)
    q = queries(rng, 2)

    async def body(c):
        await c.append(seq, 0, keys, values)
        items = [AttendItem(seq, 0, q[i]) for i in range(2)]
        want = await c.attend(items, output_dtype="bf16")
        sharded = driftkv.aio.ShardedClient([c.target], clients=[c])
        async with await c.register_host_region(REGION_BYTES, name="pytest-aio-sharded") as region:
            out = region.alloc((2, Q_HEADS, HEAD_DIM), np.uint16)
            lse = region.alloc((2, Q_HEADS), np.float32)
            ref_items = [AttendItem(seq, 0, v) for v in in_region(region, q)]
            calls = []
            real = c._attend

            async def spy(batch, wire_dtype, timeout, dests=None, output_dtype="f32"):
                calls.append((await c._attend_request(batch, wire_dtype, dests, output_dtype))[0])
                return await real(batch, wire_dtype, timeout, dests, output_dtype)
            c._attend = spy
            got = await sharded.attend(ref_items, out=out, lse=lse)
            c._attend = real
            assert got.output is out and got.lse is lse
            assert all(m.HasField("query_ref") and m.HasField("output_ref") for m in calls[0].items)
            each = await sharded.attend_each(items, output_dtype="bf16")
            with pytest.raises(DriftkvError) as e:
                await sharded.attend(pb.AttendRequest())
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            return want, out.copy(), lse.copy(), each

    want, out, lse, each = run(aio_dp_server, body)
    np.testing.assert_array_equal(bf16_bits_to_f32(out), want.output)
    np.testing.assert_array_equal(lse, want.lse)
    np.testing.assert_array_equal(np.stack([r.output for r in each]), want.output)


# -- bad references: the aio client's errors are the sync client's ----------

def bad_cases(seq):
    """(what, setup) pairs: setup(region, unregister) -> (item, out, lse,
    the details the server or the client answers with)."""
    def unregistered(region, unregister):
        q = in_region(region, np.ones((Q_HEADS, HEAD_DIM), np.float32))
        unregister(region.id)  # behind the client's back: it still finds q in the region
        return AttendItem(seq, 0, q), None, None, f"items[0].query_ref.region_id {region.id} not found"

    def misaligned_lse(region, unregister):
        q = in_region(region, np.ones((Q_HEADS, HEAD_DIM), np.float32))
        out = region.alloc((Q_HEADS, HEAD_DIM), np.float32)
        base = region.offset_of(out.__array_interface__["data"][0], out.nbytes) + out.nbytes
        lse = region.ndarray(base + 2, (Q_HEADS,), np.float32)  # C-contiguous, 2 bytes off
        return AttendItem(seq, 0, q), out, lse, f"items[0].lse_ref.offset {base + 2} is not a multiple of 4"

    def not_finite(region, unregister):
        bad = np.ones((Q_HEADS, HEAD_DIM), np.float32)
        bad.flat[17] = np.inf
        return AttendItem(seq, 0, in_region(region, bad)), None, None, \
            "items[0].query_ref element 17 is inf; must be finite"

    def out_without_lse(region, unregister):
        q = in_region(region, np.ones((Q_HEADS, HEAD_DIM), np.float32))
        return AttendItem(seq, 0, q), region.alloc((Q_HEADS, HEAD_DIM), np.float32), None, \
            "out and lse go together (both or neither)"

    return [("unregistered", unregistered), ("misaligned_lse", misaligned_lse), ("not_finite", not_finite),
            ("out_without_lse", out_without_lse)]


def expect_error(call):
    try:
        call()
    except DriftkvError as e:
        return e.code, e.details
    raise AssertionError("no error")


async def expect_error_async(call):
    try:
        await call()
    except DriftkvError as e:
        return e.code, e.details
    raise AssertionError("no error")


def test_bad_references_fail_as_through_the_sync_client(aio_dp_server, sync_client, rng):
    seq = name("aio-bad")
    keys, values = kv(rng, TOKENS)
    sync_client.append(seq, 0, keys, values)
    cases = bad_cases(seq)

    def closed(region, what):
        """close() of a region the server forgot already is NOT_FOUND."""
        if what == "unregistered":
            with pytest.raises(DriftkvError) as e:
                region.close()
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        else:
            region.close()

    sync_errors = {}
    for what, setup in cases:
        region = sync_client.register_host_region(64 << 10, name="pytest-sync-bad")
        item, out, lse, want = setup(region, lambda rid: R.unregister_region(sync_client, rid))
        sync_errors[what] = expect_error(lambda: sync_client.attend(item, out=out, lse=lse)) + (want,)
        closed(region, what)

    async def body(c):
        errors = {}
        for what, setup in cases:
            region = await c.register_host_region(64 << 10, name="pytest-aio-bad")
            item, out, lse, want = setup(region, lambda rid: R.unregister_region(c._sync, rid))
            errors[what] = await expect_error_async(lambda: c.attend(item, out=out, lse=lse)) + (want,)
            await asyncio.to_thread(closed, region, what)
        # A raw request passes through as it is: past the region's end, and
        # an id never issued; the sync client answers the same request alike.
        async with await c.register_host_region(4096, name="pytest-aio-raw") as region:
            for what, ref in (("past_the_end", region.ref(4096 - 4)), ("never_issued", pb.TensorRef(region_id=12345))):
                req = pb.AttendRequest()
                m = req.items.add(sequence_id=seq, layer=0, dtype=pb.DTYPE_F32, q_heads=Q_HEADS, head_dim=HEAD_DIM)
                m.query_ref.CopyFrom(ref)
                errors[what] = await expect_error_async(lambda: c.attend(req)) + (region.id,)
                sync_errors[what] = await asyncio.to_thread(expect_error, lambda: sync_client.attend(req))
        return errors

    aio_errors = run(aio_dp_server, body)
    for what, _ in cases:
        code, details, want = aio_errors[what]
        sync_code, sync_details, sync_want = sync_errors[what]
        assert code == sync_code, what
        assert details == want and sync_details == sync_want, (what, details, sync_details)
    # Messages without a region id are the same text from both clients.
    for what in ("misaligned_lse", "not_finite", "out_without_lse", "past_the_end", "never_issued"):
        assert aio_errors[what][:2] == sync_errors[what][:2], what
    assert aio_errors["unregistered"][0] == grpc.StatusCode.NOT_FOUND
    for what in ("misaligned_lse", "not_finite", "out_without_lse"):
        assert aio_errors[what][0] == grpc.StatusCode.INVALID_ARGUMENT, what
    assert aio_errors["never_issued"][:2] == (grpc.StatusCode.NOT_FOUND, "items[0].query_ref.region_id 12345 not found")
    code, details, raw_id = aio_errors["past_the_end"]
    assert (code, details) == (grpc.StatusCode.OUT_OF_RANGE, f"items[0].query_ref.offset 4092 + 4096 bytes is past "
                                                             f"the end of region {raw_id} (4096 bytes)")


def test_close_unregisters_regions_and_stats_agree(aio_dp_server, sync_client):
    before = sync_client.stats().regions_registered

    async def body(c):
        region = await c.register_host_region(8192, name="pytest-aio-close")
        stats = await c.stats()
        assert stats.tenant_regions >= 1
        await region.aclose()
        assert region.offset_of(0, 0) is None
        return (await c.stats()).regions_registered

    assert run(aio_dp_server, body) == before + 1
    assert sync_client.stats().regions == 0
