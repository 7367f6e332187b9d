"""driftkv.aio.Client: the asyncio client (grpc.aio), for decode loops that
run in an event loop. The same methods as driftkv.Client, as coroutines,
under the same retry and deadline rules (driftkv._retry); sleeps between
attempts are asyncio.sleep. One client per event loop.
driftkv.aio.ShardedClient: driftkv.ShardedClient's routing over aio Clients.

    async with driftkv.aio.Client("127.0.0.1:50051") as c:
        out, lse = await c.attend(items)

The data plane is the sync client's (driftkv/_refs.py, driftkv/regions.py):
attend sends by reference what lies in the client's registered host
regions and torch CUDA tensors, out=/lse= included. Memory regions are
control-plane work with blocking steps (the region socket's memfd
handoff, the lease renewer thread), so they go through a sync
driftkv.Client on the same target and credentials, made with this one
and connected on first use, its calls run in a thread
(asyncio.to_thread); the Attend calls themselves stay on grpc.aio. A CUDA
tensor whose allocation is not registered yet is registered in that
thread before the request is built again; the event loop never waits on
a RegisterRegion.
"""
import asyncio
from typing import TYPE_CHECKING, AsyncIterable, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from driftkv import _validate as V
from driftkv import _wire as W
from driftkv._channel import Security, open_channel
from driftkv import sharded as S
from driftkv._errors import DriftkvError, closed_error, invalid
from driftkv._proto import pb, pb_grpc
from driftkv._retry import RetryPolicy, retryable
from driftkv._types import (AppendResult, Array, AttendItem, AttendResult, Attention, Chunk, ForkResult, Info,
                            LayerLength, LookupResult, PinResult, ReadResult, ReleaseResult, Stats, from_message)
from driftkv._wire import Progress
from driftkv.client import Client as SyncClient, _repr
from driftkv.page_watch import AsyncPageWatch

if TYPE_CHECKING:
    from driftkv.regions import HostRegion

# Builds of one request at most. The first finds the CUDA tensors not
# registered yet; the second the lse of an out= that was among them (out
# and lse go by reference together, so lse is looked at only once out has
# a ref); the third has everything; a fourth covers an allocation that
# another call registered smaller meanwhile. The last build's unregistered
# tensors travel inline, with the same answers.
_BUILD_ROUNDS = 4


class Client:
    """See driftkv.Client; every method is a coroutine here."""

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: float = 30.0,
                 retry: RetryPolicy = RetryPolicy(), max_message_bytes: Optional[int] = None,
                 channel_options: Sequence[Tuple[str, object]] = (), tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None, token: Optional[str] = None):
        self.target = target
        self._security = Security(tls_ca, tls_cert, tls_key, tls_server_name, token)
        self._security.credentials()  # bad files and a token without TLS fail here
        if V.timeout(timeout) is None:
            raise invalid("timeout is None; expected a number of seconds > 0")
        self.timeout = timeout
        self.retry = retry
        self.retries = 0
        self._closed = False
        self._max_message_bytes = max_message_bytes
        self._extra = list(channel_options)
        self._lock = asyncio.Lock()
        self._channel: Optional[grpc.aio.Channel] = None
        self._stub = None
        self._info: Optional[Info] = None
        self._limit = 0
        # Memory regions' control plane (see the module's header).
        self._sync = SyncClient(target, timeout=timeout, retry=retry, max_message_bytes=max_message_bytes,
                                channel_options=channel_options, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                tls_server_name=tls_server_name, token=token)
        self._places = self._sync._places

    async def __aenter__(self) -> "Client":
        await self._connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return _repr("driftkv.aio.Client", self.target, self._security, self._closed)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """See driftkv.Client.close: final, idempotent; closes the host
        regions still open, unregisters the CUDA registrations, closes both
        channels (calls in flight end CANCELLED)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._sync.close)
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def server_info(self) -> Info:
        await self._connect()
        return self._info

    async def max_message_bytes(self) -> int:
        await self._connect()
        return self._limit

    async def _connect(self):
        async with self._lock:
            if self._closed:
                raise closed_error(self)
            if self._stub is not None:
                return self._stub
            bootstrap = open_channel(self.target, self._extra, self._security, aio=True)
            try:
                stub = pb_grpc.KvCacheStub(bootstrap)
                info = await self._call(True, lambda t: stub.Info(pb.InfoRequest(), timeout=t))
            finally:
                await bootstrap.close()
            self._info = from_message(Info, info)
            self._limit = self._max_message_bytes or self._info.max_message_bytes
            self._channel = open_channel(self.target, W.channel_options(self._limit) + self._extra, self._security,
                                         aio=True)
            self._stub = pb_grpc.KvCacheStub(self._channel)
            return self._stub

    async def _call(self, idempotent: bool, attempt: Callable, timeout: Optional[float] = None):
        """Awaits attempt(timeout) under the retry rules; raises DriftkvError."""
        t = V.timeout(timeout)
        t = self.timeout if t is None else t
        error = None
        for n, sleep in enumerate(self.retry.sleeps(idempotent)):
            if n > 0:
                self.retries += 1
                await asyncio.sleep(sleep)
            try:
                return await attempt(t)
            except grpc.RpcError as e:
                if self._closed:
                    raise closed_error(self, grpc.StatusCode.CANCELLED) from None
                error = e
                if not retryable(e):
                    break
            except Exception:  # noqa: BLE001 - grpc.aio's UsageError on a channel closed meanwhile
                if self._closed:
                    raise closed_error(self, grpc.StatusCode.CANCELLED) from None
                raise
        raise DriftkvError.from_rpc(error)

    async def info(self, *, timeout: Optional[float] = None) -> Info:
        V.timeout(timeout)
        stub = await self._connect()
        return from_message(Info, await self._call(True, lambda t: stub.Info(pb.InfoRequest(), timeout=t), timeout))

    async def stats(self, *, timeout: Optional[float] = None) -> Stats:
        V.timeout(timeout)
        stub = await self._connect()
        return from_message(Stats, await self._call(True, lambda t: stub.Stats(pb.StatsRequest(), timeout=t),
                                                    timeout))

    async def length(self, sequence_id: str, *, timeout: Optional[float] = None) -> List[LayerLength]:
        req = pb.LengthRequest(sequence_id=V.text(sequence_id, "sequence_id"))
        V.timeout(timeout)
        stub = await self._connect()
        return W.lengths(await self._call(True, lambda t: stub.Length(req, timeout=t), timeout))

    async def prefetch(self, sequence_id: str, *, timeout: Optional[float] = None) -> int:
        """driftkv.Client.prefetch."""
        req = pb.PrefetchRequest(sequence_id=V.text(sequence_id, "sequence_id"))
        V.timeout(timeout)
        stub = await self._connect()
        return int((await self._call(True, lambda t: stub.Prefetch(req, timeout=t), timeout)).pages_restored)

    async def append(self, sequence_id: str, layer: int, keys, values, *, first_token: int = 0,
                     wire_dtype: Optional[str] = None, chunk_tokens: int = W.DEFAULT_CHUNK_TOKENS,
                     progress: Optional[Progress] = None, timeout: Optional[float] = None,
                     token_ids: Optional[Sequence[int]] = None) -> AppendResult:
        return await self.append_chunks(W.split_layer(sequence_id, layer, keys, values, first_token, chunk_tokens,
                                                      wire_dtype, token_ids), progress=progress, timeout=timeout)

    async def append_chunks(self, chunks: Union[Iterable[Chunk], AsyncIterable[Chunk]], *,
                            progress: Optional[Progress] = None, timeout: Optional[float] = None) -> AppendResult:
        """See driftkv.Client.append_chunks; `chunks` may also be an async
        iterable (e.g. an async generator fed by the prefill)."""
        sender = _AsyncChunkSender(chunks, progress)
        V.timeout(timeout)
        stub = await self._connect()
        result = await self._call(True, lambda t: stub.Append(sender.stream(), timeout=t), timeout)
        sender.raise_failure()
        return W.append_result(result)

    async def attend(self, items: Union[AttendItem, Sequence[AttendItem]], *, wire_dtype: Optional[str] = None,
                     out: Optional[Array] = None, lse: Optional[Array] = None, output_dtype: Optional[str] = None,
                     timeout: Optional[float] = None) -> Attention:
        """See driftkv.Client.attend: out=, lse=, output_dtype= and the data
        plane alike (arrays in this client's host regions and torch CUDA
        tensors go by reference); a pb.AttendRequest passes through."""
        V.timeout(timeout)
        req, idempotent, finish = await self.prepare_attend(items, wire_dtype=wire_dtype, out=out, lse=lse,
                                                            output_dtype=output_dtype)
        stub = await self._connect()
        return finish(await self._call(idempotent, lambda t: stub.Attend(req, timeout=t), timeout))

    async def prepare_attend(self, items, *, wire_dtype: Optional[str] = None, out: Optional[Array] = None,
                             lse: Optional[Array] = None, output_dtype: Optional[str] = None):
        """See driftkv.Client.prepare_attend: (request, idempotent, finish)."""
        plan = W.AttendPlan(items, out, lse, output_dtype, wire_dtype)
        if plan.request is not None:
            return plan.request, False, plan.finish
        req, idempotent = await self._attend_request(plan.batch, wire_dtype, plan.dests, plan.output_dtype)
        return req, idempotent, plan.finish

    async def attend_results(self, items: Sequence[AttendItem], *, wire_dtype: Optional[str] = None,
                             output_dtype: str = "f32", timeout: Optional[float] = None) -> List[AttendResult]:
        batch = W.results_batch(items, wire_dtype, output_dtype)
        return W.attend_results(batch, await self._attend(batch, wire_dtype, timeout, None, output_dtype),
                                output_dtype)

    async def _attend_request(self, batch, wire_dtype, dests, output_dtype):
        """W.attend_request with the client's places, built on the event
        loop from registrations that exist already; CUDA allocations seen
        for the first time are registered in a thread, then it builds again."""
        await self._connect()
        W.check_batch(len(batch), self._info.max_batch)
        for last in [False] * (_BUILD_ROUNDS - 1) + [True]:
            known = self._places.known()
            req, idempotent = W.attend_request(batch, wire_dtype, known, dests, output_dtype)
            if last or not known.unregistered:
                return req, idempotent
            await asyncio.to_thread(self._places.register_cuda, known.unregistered)

    async def _attend(self, batch, wire_dtype, timeout, dests=None, output_dtype="f32"):
        """One Attend of a batch checked already (AttendPlan, results_batch)."""
        V.timeout(timeout)
        stub = await self._connect()
        req, idempotent = await self._attend_request(batch, wire_dtype, dests, output_dtype)
        return await self._call(idempotent, lambda t: stub.Attend(req, timeout=t), timeout)

    async def read(self, sequence_id: str, layer: int, *, first_token: int = 0, token_count: int = 0,
                   wire_dtype: str = "f32", timeout: Optional[float] = None) -> ReadResult:
        request = W.read_request(sequence_id, layer, first_token, token_count, wire_dtype)
        V.timeout(timeout)
        stub = await self._connect()
        chunks = []

        async def attempt(t):
            resumed = W.resumed_read(request, chunks[-1].first_token + chunks[-1].token_count if chunks
                                     else request.first_token)
            if resumed is None:
                return None
            async for c in stub.Read(resumed, timeout=t):
                chunks.append(c)

        await self._call(True, attempt, timeout)
        return W.read_result(chunks, self._info)

    async def release(self, sequence_id: str, *, timeout: Optional[float] = None) -> ReleaseResult:
        req = pb.ReleaseRequest(sequence_id=V.text(sequence_id, "sequence_id"))
        V.timeout(timeout)
        stub = await self._connect()
        tries = [0]

        async def attempt(t):
            tries[0] += 1
            try:
                return await stub.Release(req, timeout=t)
            except grpc.RpcError as e:
                if tries[0] > 1 and e.code() == grpc.StatusCode.NOT_FOUND:
                    return pb.ReleaseResponse()
                raise

        r = await self._call(True, attempt, timeout)
        return ReleaseResult(r.tokens_freed, r.pages_freed)

    async def fork(self, source_sequence_id: str, sequence_id: str, tokens: int, *, new_incarnation: bool = False,
                   timeout: Optional[float] = None) -> ForkResult:
        """See driftkv.Client.fork (never retried)."""
        req = W.fork_request(source_sequence_id, sequence_id, tokens, new_incarnation)
        V.timeout(timeout)
        stub = await self._connect()
        return W.fork_result(await self._call(False, lambda t: stub.Fork(req, timeout=t), timeout))

    async def lookup(self, token_ids: Optional[Sequence[int]] = None, *, page_keys: Optional[Sequence[bytes]] = None,
                     timeout: Optional[float] = None) -> LookupResult:
        """See driftkv.Client.lookup (retried: read-only)."""
        req = W.lookup_request(token_ids, page_keys)
        V.timeout(timeout)
        stub = await self._connect()
        return W.lookup_result(await self._call(True, lambda t: stub.Lookup(req, timeout=t), timeout))

    async def fork_from_prefix(self, sequence_id: str, token_ids: Optional[Sequence[int]] = None, *,
                               page_keys: Optional[Sequence[bytes]] = None, max_tokens: int = 0,
                               new_incarnation: bool = False, timeout: Optional[float] = None) -> ForkResult:
        """See driftkv.Client.fork_from_prefix (never retried)."""
        req = W.fork_prefix_request(sequence_id, token_ids, page_keys, max_tokens, new_incarnation)
        V.timeout(timeout)
        stub = await self._connect()
        return W.fork_result(await self._call(False, lambda t: stub.Fork(req, timeout=t), timeout))

    async def pin(self, pin_id: str, token_ids: Optional[Sequence[int]] = None, *,
                  page_keys: Optional[Sequence[bytes]] = None, ttl_seconds: float, max_tokens: int = 0,
                  timeout: Optional[float] = None) -> PinResult:
        """See driftkv.Client.pin (retried: a repeat replaces the pin)."""
        req = W.pin_request(pin_id, token_ids, page_keys, ttl_seconds, max_tokens)
        V.timeout(timeout)
        stub = await self._connect()
        return W.pin_result(await self._call(True, lambda t: stub.Pin(req, timeout=t), timeout))

    async def unpin(self, pin_id: str, *, timeout: Optional[float] = None) -> int:
        """See driftkv.Client.unpin (never retried)."""
        req = pb.UnpinRequest(pin_id=V.text(pin_id, "pin_id"))
        V.timeout(timeout)
        stub = await self._connect()
        return int((await self._call(False, lambda t: stub.Unpin(req, timeout=t), timeout)).pages_unpinned)

    async def watch_pages(self, *, max_batch: int = 0, buffer_events: int = 0,
                          timeout: Optional[float] = None) -> AsyncPageWatch:
        """See driftkv.Client.watch_pages: an async iterator of
        PageEventBatch (`async for b in await c.watch_pages()`); cancel(),
        `await w.aclose()` or the `async with` block's end stops it."""
        req = W.watch_request(max_batch, buffer_events)
        t = V.timeout(timeout)
        stub = await self._connect()
        return AsyncPageWatch(self, stub.WatchPages(req, timeout=t))

    # -- memory regions (driftkv/regions.py), through the sync client -------

    async def register_host_region(self, nbytes: int, **kwargs) -> "HostRegion":
        """See driftkv.Client.register_host_region; the region's memfd
        handoff and RegisterRegion run in a thread. The region is the sync
        machinery's HostRegion: close() blocks, `await region.aclose()` (or
        `async with`) does not."""
        return await asyncio.to_thread(self._sync.register_host_region, nbytes, **kwargs)

    async def register_cuda_region(self, tensor) -> "pb.TensorRef":
        """See driftkv.Client.register_cuda_region (in a thread)."""
        return await asyncio.to_thread(self._sync.register_cuda_region, tensor)


class _AsyncChunkSender(W.ChunkSender):
    """ChunkSender over a sync or async iterable, as an async generator."""

    def __init__(self, chunks, progress):
        self._async = hasattr(chunks, "__aiter__")
        super().__init__(() if self._async else chunks, progress)
        if self._async:
            self._aiter = chunks.__aiter__()

    async def _anext(self):
        if not self._async:
            return self._next()
        try:
            return W.chunk_message(await self._aiter.__anext__(), f"chunks[{len(self._sent)}]")
        except StopAsyncIteration:
            return None
        except Exception as e:  # noqa: BLE001 - re-raised by raise_failure
            self._failure = e
            return None

    async def stream(self):
        for m in list(self._sent):
            yield m
        while self._failure is None:
            m = await self._anext()
            if m is None:
                return
            self._sent.append(m)
            self._tokens += m.token_count
            yield m
            if self._progress is not None:
                self._progress(len(self._sent), self._tokens)


class ShardedClient(S.ReplicaClients):
    """driftkv.ShardedClient for an event loop: the same routing
    (driftkv.sharded.Router), errors and results, every method a coroutine;
    the per-replica calls of one method run concurrently (asyncio.gather).
    One client per event loop."""

    def __init__(self, replicas: Sequence[str], *, clients: Optional[Sequence[Client]] = None, **client_options):
        super().__init__(replicas, Client, clients, client_options)

    async def __aenter__(self) -> "ShardedClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes every replica's client: final, idempotent."""
        self._closed = True
        for c in self._clients:
            await c.close()

    async def _routed(self, sequence_id: str, call: Callable):
        self._check_open()
        r = self.replica_of(sequence_id)
        try:
            return await call(self._clients[r])
        except DriftkvError as e:
            raise self._router.named(r, e) from None

    async def _gather(self, indexes: Sequence[int], fn: Callable) -> dict:
        """fn(i) for every i concurrently; a DriftkvError becomes i's answer."""
        async def one(i):
            try:
                return await fn(i)
            except DriftkvError as e:
                return e
        return dict(zip(indexes, await asyncio.gather(*(one(i) for i in indexes))))

    async def append(self, sequence_id: str, layer: int, keys, values, **kwargs) -> AppendResult:
        return await self._routed(sequence_id, lambda c: c.append(sequence_id, layer, keys, values, **kwargs))

    async def read(self, sequence_id: str, layer: int, **kwargs) -> ReadResult:
        return await self._routed(sequence_id, lambda c: c.read(sequence_id, layer, **kwargs))

    async def length(self, sequence_id: str, **kwargs) -> List[LayerLength]:
        return await self._routed(sequence_id, lambda c: c.length(sequence_id, **kwargs))

    async def release(self, sequence_id: str, **kwargs) -> ReleaseResult:
        return await self._routed(sequence_id, lambda c: c.release(sequence_id, **kwargs))

    async def append_chunks(self, chunks: Iterable[Chunk], *, progress: Optional[Progress] = None,
                            timeout: Optional[float] = None) -> AppendResult:
        """See driftkv.ShardedClient.append_chunks (a sync iterable, read to
        the end first, every chunk checked before any is sent)."""
        self._check_open()
        groups = S.grouped_chunks(self._router, chunks)
        total = S.ProgressSum(progress)
        answers = await self._gather(list(groups), lambda r: self._clients[r].append_chunks(
            groups[r], progress=total.of(r), timeout=timeout))
        for r in groups:
            if isinstance(answers[r], DriftkvError):
                raise self._router.named(r, answers[r])
        return S.summed(answers.values())

    async def _attend(self, batch: List[AttendItem], wire_dtype, timeout, dests=None, output_dtype: str = "f32"):
        """See driftkv.ShardedClient._attend: a batch checked already."""
        self._check_open()
        V.timeout(timeout)
        groups = self._router.split(it.sequence_id for it in batch)
        # Each replica's client sends by reference what lies in its own
        # regions; the rest of a sub-batch goes inline.
        answers = await self._gather(list(groups), lambda r: self._clients[r]._attend(
            [batch[i] for i in groups[r]], wire_dtype, timeout,
            None if dests is None else [dests[i] for i in groups[r]], output_dtype))
        return S.scatter_attend(self._router, len(batch), groups, answers)

    async def attend_each(self, items: Sequence[AttendItem], *, wire_dtype: Optional[str] = None,
                          output_dtype: str = "f32",
                          timeout: Optional[float] = None) -> List[Union[AttendResult, DriftkvError]]:
        batch = W.results_batch(items, wire_dtype, output_dtype)
        return S.each_result(batch, *await self._attend(batch, wire_dtype, timeout, None, output_dtype),
                             output_dtype)

    async def attend(self, items: Union[AttendItem, Sequence[AttendItem]], *, wire_dtype: Optional[str] = None,
                     out: Optional[Array] = None, lse: Optional[Array] = None, output_dtype: Optional[str] = None,
                     timeout: Optional[float] = None) -> Attention:
        """See driftkv.ShardedClient.attend (out, lse, output_dtype too)."""
        plan = S.attend_plan(items, out, lse, output_dtype, wire_dtype)
        return plan.finish(S.all_or_nothing(*await self._attend(plan.batch, wire_dtype, timeout, plan.dests,
                                                                plan.output_dtype)))

    async def attend_results(self, items: Sequence[AttendItem], *, wire_dtype: Optional[str] = None,
                             output_dtype: str = "f32", timeout: Optional[float] = None) -> List[AttendResult]:
        batch = W.results_batch(items, wire_dtype, output_dtype)
        return W.attend_results(batch, S.all_or_nothing(*await self._attend(batch, wire_dtype, timeout, None,
                                                                            output_dtype)), output_dtype)

    async def _all(self, fn: Callable) -> list:
        self._check_open()
        answers = await self._gather(list(range(len(self._clients))), lambda r: fn(self._clients[r]))
        return [self._router.named(r, a) if isinstance(a, DriftkvError) else a for r, a in sorted(answers.items())]

    async def info_all(self, *, timeout: Optional[float] = None) -> List[Union[Info, DriftkvError]]:
        V.timeout(timeout)
        return await self._all(lambda c: c.info(timeout=timeout))

    async def stats_all(self, *, timeout: Optional[float] = None) -> List[Union[Stats, DriftkvError]]:
        V.timeout(timeout)
        return await self._all(lambda c: c.stats(timeout=timeout))

    async def lookup_all(self, token_ids: Optional[Sequence[int]] = None, *,
                         page_keys: Optional[Sequence[bytes]] = None,
                         timeout: Optional[float] = None) -> List[Union[LookupResult, DriftkvError]]:
        """See driftkv.ShardedClient.lookup_all."""
        V.timeout(timeout)
        return await self._all(lambda c: c.lookup(token_ids, page_keys=page_keys, timeout=timeout))

    async def fork_from_prefix(self, base: str, token_ids: Optional[Sequence[int]] = None, *,
                               page_keys: Optional[Sequence[bytes]] = None, max_tokens: int = 0,
                               timeout: Optional[float] = None) -> "S.PrefixFork":
        """See driftkv.ShardedClient.fork_from_prefix (never retried)."""
        answers = await self.lookup_all(token_ids, page_keys=page_keys, timeout=timeout)
        best, sequence_id = S.prefix_target(self._router, answers, V.text(base, "base"))
        result = await self._routed(sequence_id, lambda c: c.fork_from_prefix(
            sequence_id, token_ids, page_keys=page_keys, max_tokens=max_tokens, timeout=timeout))
        return S.PrefixFork(sequence_id, best, result)
