"""Pins and page events from Python, against real servers: a pinned prefix
survives the eviction of everything else and is evicted once unpinned;
WatchPages reports those stores and evictions, by keys computed here with
driftkv.prefix; a pin past the tenant's max_pages is RESOURCE_EXHAUSTED
naming the quota; refusals; cancelling a watch from another thread or task;
the asyncio client."""
import asyncio
import threading
import time
import uuid

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from conftest import MODEL_CONFIG, kv
from driftkv import prefix
from driftkv.local_server import LocalServer

P = 128  # MODEL_CONFIG's page_tokens (and window_tokens)
LAYERS = 4


def sid(tag="s"):
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def config(**fields):
    """MODEL_CONFIG with `fields` set (a field given twice is an error in
    text format, so pool_bytes is replaced, not added)."""
    lines = [l for l in MODEL_CONFIG.strip().splitlines() if l.split(":")[0].strip() not in fields]
    return "\n".join(lines + [f"{k}: {v}" for k, v in fields.items()]) + "\n"


@pytest.fixture(scope="module")
def tight_server():
    """A pool of about 48 pages, so that a test fills it in a few calls."""
    with LocalServer(config_text=MODEL_CONFIG) as probe, driftkv.Client(probe.target) as c:
        page = c.info().page_bytes
    with LocalServer(config_text=config(pool_bytes=48 * page)) as s:
        yield s


@pytest.fixture(scope="module")
def quota_server():
    with LocalServer(config_text=config(tenant_max_pages=12)) as s:
        yield s


def store(c, rng, prompt, layers=LAYERS):
    """A sequence of the token ids `prompt` (whole pages) and one page
    more in `layers` layers, released: the prompt's pages (the window
    holds the last one) stay in the prefix index only."""
    s = sid("src")
    keys, values = kv(rng, len(prompt) + P, scale=0.5)
    ids = list(prompt) + random_ids(rng, P)
    for layer in range(layers):
        c.append(s, layer, keys, values, token_ids=ids, wire_dtype="bf16")
    c.release(s)


def random_ids(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).tolist()


class Collector:
    """Reads a PageWatch on a thread of its own, keeping every event and
    how the iteration ended (None: it stopped cleanly)."""

    def __init__(self, watch):
        self.watch = watch
        self.events = []
        self.error = "running"
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for batch in self.watch:
                with self.lock:
                    self.events.extend(batch.events)
            self.error = None
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error = e

    def seen(self):
        with self.lock:
            return {(e.kind, e.page_key, e.layer) for e in self.events}

    def wait_for(self, wanted, seconds=10.0):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if wanted <= self.seen():
                return True
            time.sleep(0.02)
        return False


def subscribe(c, collector, rng):
    """Returns once the server's subscription is live: the server
    subscribes when it runs the call, which the client cannot see, so
    pages are stored until the watch reports one (a page of layer 0 per
    try)."""
    for _ in range(50):
        probe = random_ids(rng, P)
        store(c, rng, probe, layers=1)
        if collector.wait_for({("stored", prefix.page_keys(probe, P)[0], 0)}, 0.2):
            return
    raise AssertionError("the watch reported no probe page in 50 tries")


def expected(kind, ids):
    return {(kind, k, layer) for k in prefix.page_keys(ids, P) for layer in range(LAYERS)}


def fill_pool(c, rng):
    """Appends sequences without token ids until the pool refuses one
    ("pool full": nothing evictable left); returns their ids, the refused
    one last."""
    keys, values = kv(rng, 3 * P)
    fillers = []
    for _ in range(200):
        f = sid("fill")
        fillers.append(f)
        try:
            for layer in range(LAYERS):
                c.append(f, layer, keys, values, wire_dtype="bf16")
        except driftkv.DriftkvError as e:
            assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "pool full" in e.details, e
            return fillers
    raise AssertionError("the pool never filled")


def test_a_pin_keeps_its_prefix_through_eviction_and_the_watch_sees_it(tight_server, rng):
    a_ids, b_ids = random_ids(rng, 2 * P), random_ids(rng, 2 * P)  # 2 pages each
    with driftkv.Client(tight_server.target, timeout=20) as c:
        watch = c.watch_pages(max_batch=3)
        got = Collector(watch)
        subscribe(c, got, rng)
        store(c, rng, a_ids)
        store(c, rng, b_ids)
        assert got.wait_for(expected("stored", a_ids) | expected("stored", b_ids))
        assert c.lookup(a_ids).pages == c.lookup(b_ids).pages == 2

        before = time.time()
        pin = c.pin("system-a", a_ids, ttl_seconds=600)
        assert pin[:2] == (2 * P, 2 * LAYERS) and pin.replaced is False
        assert before * 1000 + 600_000 - 5_000 <= pin.expire_unix_ms <= time.time() * 1000 + 600_000 + 5_000

        fillers = fill_pool(c, rng)
        a, b = c.lookup(a_ids), c.lookup(b_ids)
        assert (a.pages, a.layer_pages, a.miss_reason) == (2, [2] * LAYERS, "none")
        assert (b.pages, b.miss_page, b.miss_reason) == (0, 0, "evicted")
        assert got.wait_for(expected("evicted", b_ids))
        assert not expected("evicted", a_ids) & got.seen()

        # Unpinned, the prefix is cache again: the pool has no free page
        # and nothing else to evict, so the next pages come from A's.
        assert c.unpin("system-a") == 2 * LAYERS
        with pytest.raises(driftkv.DriftkvError) as e:
            c.unpin("system-a")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        fillers.append(sid("fill"))
        keys, values = kv(rng, 3 * P)
        for layer in range(LAYERS):  # 2 pages a layer: as many as A holds
            c.append(fillers[-1], layer, keys, values, wire_dtype="bf16")
        a = c.lookup(a_ids)
        assert (a.pages, a.miss_reason) == (0, "evicted")
        assert got.wait_for(expected("evicted", a_ids))

        assert got.error == "running" and watch.dropped == 0
        watch.cancel()  # from this thread, while the collector's thread waits in next()
        got.thread.join(5)
        assert not got.thread.is_alive() and got.error is None and watch.cancelled
        assert list(watch) == []  # a cancelled watch stays ended
        for f in fillers:
            try:
                c.release(f)
            except driftkv.DriftkvError as e:  # the refused one, if its first chunk was refused
                assert e.code == grpc.StatusCode.NOT_FOUND and f == fillers[-2], e


def test_a_pin_past_the_quota_names_it_and_a_renewal_at_the_quota_fits(quota_server, rng):
    ids = random_ids(rng, 2 * P)
    with driftkv.Client(quota_server.target, timeout=20) as c:
        store(c, rng, ids)  # 8 pages while live, then charged to nobody
        assert c.stats().tenant_pages == 0
        first = c.pin("p1", ids, ttl_seconds=60)
        assert (first.pages_pinned, first.replaced) == (8, False)
        assert c.stats().tenant_pages == 8
        with pytest.raises(driftkv.DriftkvError) as e:
            c.pin("p2", page_keys=prefix.page_keys(ids, P), ttl_seconds=60)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details == ('pin_id "p2": the server\'s one tenant (no tokens_file): quota max_pages 12: '
                                   "it holds 8 pages and this call needs 8 more; release sequences or raise the quota")
        assert c.stats().tenant_pages == 8  # the refused pin charged nothing
        renewed = c.pin("p1", ids, ttl_seconds=120, max_tokens=P)
        assert (renewed.tokens, renewed.pages_pinned, renewed.replaced) == (P, 4, True)
        assert renewed.expire_unix_ms > first.expire_unix_ms
        assert c.stats().tenant_pages == 4
        assert c.unpin("p1") == 4
        assert c.stats().tenant_pages == 0


def test_pin_and_watch_refusals(server, rng):
    ids = random_ids(rng, 2 * P)
    with driftkv.Client(server.target, timeout=20) as c:
        for call, details in (
                (lambda: c.pin("p", ids, ttl_seconds=0), "ttl_seconds is 0; expected a number of seconds > 0"),
                (lambda: c.pin("p", ids, ttl_seconds=float("nan")),
                 "ttl_seconds is nan; expected a number of seconds > 0"),
                (lambda: c.pin("p", ttl_seconds=5), "pass one of prefix_token_ids and prefix_page_keys"),
                (lambda: c.pin(7, ids, ttl_seconds=5), "pin_id is 7; expected a str"),
                (lambda: c.pin("p", ids, ttl_seconds=5, max_tokens=-1), "max_tokens -1 out of range [0, "
                 "18446744073709551615]"),
                (lambda: c.unpin(None), "pin_id is None; expected a str"),
                (lambda: c.watch_pages(max_batch=4097), "max_batch 4097 out of range [0, 4096]"),
                (lambda: c.watch_pages(buffer_events=(1 << 20) + 1), "buffer_events 1048577 out of range "
                 "[0, 1048576]"),
                (lambda: c.watch_pages(timeout=0), "timeout is 0; expected a number of seconds > 0")):
            with pytest.raises(driftkv.DriftkvError) as e:
                call()
            assert (e.value.code, e.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, details)
        # The server's own.
        with pytest.raises(driftkv.DriftkvError) as e:
            c.pin("p", ids, ttl_seconds=604801)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "ttl_seconds 604801 is outside" in e.value.details
        with pytest.raises(driftkv.DriftkvError) as e:
            c.pin("never", ids, ttl_seconds=5)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert e.value.details.startswith('no stored prefix of the prompt for pin_id "never": page 0')
        with pytest.raises(driftkv.DriftkvError) as e:
            c.unpin("no-such-pin")
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_a_watch_ends_with_its_deadline_and_with_the_client(server):
    with driftkv.Client(server.target, timeout=20) as c:
        start = time.monotonic()
        with pytest.raises(driftkv.DriftkvError) as e:
            for _ in c.watch_pages(timeout=0.5):
                pass
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - start < 5
        with c.watch_pages() as w:  # the with block's end cancels it
            pass
        assert w.cancelled and list(w) == []
        got = Collector(c.watch_pages())
        time.sleep(0.2)
        c.close()
        got.thread.join(5)
        assert isinstance(got.error, driftkv.DriftkvError) and got.error.code == grpc.StatusCode.CANCELLED
        assert "was closed during the call" in got.error.details


def test_pins_and_page_events_in_asyncio(server, rng):
    ids = random_ids(rng, 2 * P)

    async def main():
        async with driftkv.aio.Client(server.target, timeout=20) as c:
            watch = await c.watch_pages()
            seen = set()

            async def read():
                async for batch in watch:
                    seen.update((e.kind, e.page_key, e.layer) for e in batch.events)

            async def wait_for(wanted, seconds):
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline and not wanted <= seen:
                    await asyncio.sleep(0.02)
                return wanted <= seen

            async def store_async(prompt, layers):  # store() on the event loop
                s = sid("aio")
                keys, values = kv(rng, len(prompt) + P, scale=0.5)
                ids = list(prompt) + random_ids(rng, P)
                for layer in range(layers):
                    await c.append(s, layer, keys, values, token_ids=ids, wire_dtype="bf16")
                await c.release(s)

            reader = asyncio.create_task(read())
            for _ in range(50):  # until the subscription is live (subscribe())
                probe = random_ids(rng, P)
                await store_async(probe, 1)
                if await wait_for({("stored", prefix.page_keys(probe, P)[0], 0)}, 0.2):
                    break
            await store_async(ids, LAYERS)
            assert await wait_for(expected("stored", ids), 10)
            assert watch.dropped == 0

            pin = await c.pin("aio-pin", page_keys=prefix.page_keys(ids, P), ttl_seconds=30)
            assert (pin.tokens, pin.pages_pinned, pin.replaced) == (2 * P, 2 * LAYERS, False)
            assert (await c.pin("aio-pin", ids, ttl_seconds=30)).replaced is True
            assert await c.unpin("aio-pin") == 2 * LAYERS
            with pytest.raises(driftkv.DriftkvError) as e:
                await c.unpin("aio-pin")
            assert e.value.code == grpc.StatusCode.NOT_FOUND

            watch.cancel()  # from this task, while `reader` awaits a batch
            await asyncio.wait_for(reader, 5)  # it ends cleanly: no exception
            assert watch.cancelled

            # Cancelling the task that reads cancels the call too.
            other = await c.watch_pages()
            task = asyncio.create_task(other.__anext__())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(StopAsyncIteration):
                await other.__anext__()

            async with await c.watch_pages(timeout=0.3) as timed:
                with pytest.raises(driftkv.DriftkvError) as e:
                    async for _ in timed:
                        pass
                assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    asyncio.run(main())
