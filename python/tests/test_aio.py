"""driftkv.aio.Client: the same calls and rules from an event loop."""
import asyncio
import uuid

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from conftest import exact_attention, kv


def test_decode_loop_in_asyncio(server, rng):
    s = "a-" + uuid.uuid4().hex[:12]
    keys, values = kv(rng, 300)
    qs = rng.standard_normal((4, 8, 128)).astype(np.float32)

    async def chunks():
        for t in range(0, 296, 100):
            yield driftkv.Chunk(s, 0, t, keys[t:min(t + 100, 296)], values[t:min(t + 100, 296)])

    async def main():
        async with driftkv.aio.Client(server.target) as c:
            assert (await c.info()).layers == 4
            assert await c.max_message_bytes() == 64 << 20
            seen = []
            r = await c.append_chunks(chunks(), progress=lambda n, tokens: seen.append(tokens))
            assert r == driftkv.AppendResult(3, 296, 0) and seen == [100, 200, 296]
            outs = []
            for i, t in enumerate(range(296, 300)):  # decode steps, idempotent
                out, lse = await c.attend([driftkv.AttendItem(s, 0, qs[i], new_key=keys[t], new_value=values[t],
                                                              new_token_index=t)])
                outs.append(out[0])
            assert (await c.length(s))[0] == driftkv.LayerLength(300, 128, 172)
            concurrent = await asyncio.gather(*(c.attend(driftkv.AttendItem(s, 0, q)) for q in qs))
            back = await c.read(s, 0)
            assert back.keys.shape == (300, 4, 128) and back.compressed_tokens == 128
            np.testing.assert_array_equal(back.keys[128:], keys[128:])  # window tokens are exact bf16
            assert await c.release(s) == driftkv.ReleaseResult(300, 1)
            with pytest.raises(driftkv.DriftkvError) as e:
                await c.length(s)
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            return outs, concurrent, back

    outs, concurrent, back = asyncio.run(main())
    assert len(concurrent) == 4 and concurrent[0].output.shape == (8, 128)
    # Each step attended the stored tokens up to its own: exact attention
    # over what Read reconstructs (page 0 decoded, the window as stored).
    for i, out in enumerate(outs):
        ref, _ = exact_attention(qs[i], back.keys[:297 + i], back.values[:297 + i])
        np.testing.assert_allclose(out, ref, atol=2e-3 * np.abs(ref).max())


def test_aio_retries_and_the_unretried_step(proxy, rng):
    s = "a-" + uuid.uuid4().hex[:12]
    keys, values = kv(rng, 20)
    fast = driftkv.RetryPolicy(initial_backoff=0.005, max_backoff=0.02)

    async def main():
        async with driftkv.aio.Client(proxy.target, retry=fast) as c:
            proxy.lose["Append"] = 1
            r = await c.append(s, 0, keys[:18], values[:18])
            assert r.tokens_duplicate == 18 and c.retries == 1
            q = rng.standard_normal((8, 128)).astype(np.float32)
            proxy.lose["Attend"] = 1
            with pytest.raises(driftkv.DriftkvError) as e:
                await c.attend(driftkv.AttendItem(s, 0, q, new_key=keys[18], new_value=values[18]))
            assert e.value.code == grpc.StatusCode.UNAVAILABLE and c.retries == 1
            proxy.lose["Attend"] = 1
            out, lse = await c.attend(driftkv.AttendItem(s, 0, q, new_key=keys[19], new_value=values[19],
                                                         new_token_index=19))
            assert c.retries == 2
            ref, _ = exact_attention(q, keys, values)
            np.testing.assert_allclose(out, ref, atol=2e-5)
            proxy.lose["Read"] = 1
            back = await c.read(s, 0)
            np.testing.assert_array_equal(back.keys, keys)
            proxy.lose["Release"] = 1
            assert await c.release(s) == driftkv.ReleaseResult(0, 0)

    asyncio.run(main())


def test_fork_in_asyncio(server, rng):
    s, f = "a-" + uuid.uuid4().hex[:12], "a-" + uuid.uuid4().hex[:12]
    keys, values = kv(rng, 400)

    async def main():
        async with driftkv.aio.Client(server.target) as c:
            for layer in range(4):
                await c.append(s, layer, keys, values)  # 2 pages per layer
            r = await c.fork(s, f, 128, timeout=10)
            assert r == driftkv.ForkResult([driftkv.LayerLength(128, 128, 0)] * 4, 4, 128)
            back = await c.read(f, 3)
            np.testing.assert_array_equal(back.keys, (await c.read(s, 3, token_count=128)).keys)
            with pytest.raises(driftkv.DriftkvError) as e:
                await c.fork(s, f, 128)
            assert e.value.code == grpc.StatusCode.ALREADY_EXISTS and c.retries == 0
            await c.release(s)
            assert (await c.length(f))[0] == driftkv.LayerLength(128, 128, 0)
            await c.release(f)

    asyncio.run(main())
