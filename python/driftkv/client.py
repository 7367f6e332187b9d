"""driftkv.Client: the synchronous client of driftkv.v1.KvCache.

Thread-safe: one Client may be shared by many threads (gRPC channels are).
The channel is opened on the first call: the client asks the server's Info
over a bootstrap channel and sizes its send and receive limits to the
server's max_message_bytes (gRPC's 4 MiB default cannot receive a
maximum-size Attend answer).

Every call checks its arguments whole before sending anything
(driftkv._validate) and has a deadline (timeout=, else the client's).
KeyboardInterrupt during a call cancels its RPC (gRPC cancels a blocking
call it leaves; the Read stream is cancelled here) and propagates as it
is. close() is final: the calls of other threads in flight end CANCELLED,
later calls raise FAILED_PRECONDITION.
"""
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import grpc

from driftkv import _validate as V
from driftkv import _wire as W
from driftkv._channel import Security, open_channel
from driftkv._errors import DriftkvError, closed_error, invalid
from driftkv._refs import Places
from driftkv._proto import pb, pb_grpc
from driftkv._retry import RetryPolicy, retryable
from driftkv._types import (AppendResult, Array, AttendItem, AttendResult, Attention, Chunk, ForkResult, Info,
                            LayerLength, LookupResult, PinResult, ReadResult, ReleaseResult, Stats, from_message)
from driftkv._wire import Progress

if TYPE_CHECKING:  # imported where used: regions and channels are optional
    from driftkv.attend_stream import AttendStream
    from driftkv.doorbell import Doorbell
    from driftkv.page_watch import PageWatch
    from driftkv.regions import HostRegion


class Client:
    """A connection to one driftkv-server.

    target: "host:port". timeout: deadline of each attempt, seconds.
    retry: the retry policy (docs/python.md, "Retries"). max_message_bytes:
    the channel's send and receive limit; None takes the server's (Info).
    channel_options: extra gRPC channel arguments.
    tls_ca, tls_cert, tls_key, tls_server_name, token: transport security
    (docs/security.md): TLS with the server's CA, a client certificate for
    mTLS, a bearer token (needs TLS).
    """

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
        self.retries = 0  # attempts beyond the first, over the client's life (any thread)
        self._retries_lock = threading.Lock()
        self._max_message_bytes = max_message_bytes
        self._extra = list(channel_options)
        self._lock = threading.Lock()
        self._channel: Optional[grpc.Channel] = None
        self._stub = None
        self._info: Optional[Info] = None
        self._closed = False
        self._places = Places(self)  # registered memory, found by address

    # -- connection -------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return _repr("driftkv.Client", self.target, self._security, self._closed)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Closes the client for good (again: nothing). Closes the host
        regions still open and unregisters the CUDA registrations, then
        closes the channel: calls in flight on other threads end with
        DriftkvError(CANCELLED), later calls raise
        DriftkvError(FAILED_PRECONDITION)."""
        if self._closed:
            return
        self._places.close()  # needs the channel: before it closes
        with self._lock:
            self._closed = True
            if self._channel is not None:
                self._channel.close()
            self._channel, self._stub = None, None

    @property
    def server_info(self) -> Info:
        """The server's Info as of the connection (cached)."""
        self._connect()
        return self._info

    @property
    def max_message_bytes(self) -> int:
        """The channel's send and receive limit in use."""
        self._connect()
        return self._limit

    def _connect(self):
        with self._lock:
            if self._closed:
                raise closed_error(self)
            if self._stub is not None:
                return self._stub
            bootstrap = open_channel(self.target, self._extra, self._security)
            try:
                stub = pb_grpc.KvCacheStub(bootstrap)
                info = self._call(True, lambda t: stub.Info(pb.InfoRequest(), timeout=t))
            finally:
                bootstrap.close()
            self._info = from_message(Info, info)
            self._limit = self._max_message_bytes or self._info.max_message_bytes
            self._channel = open_channel(self.target, W.channel_options(self._limit) + self._extra, self._security)
            self._stub = pb_grpc.KvCacheStub(self._channel)
            return self._stub

    def _call(self, idempotent: bool, attempt: Callable, timeout: Optional[float] = None):
        """Runs attempt(timeout) under the retry rules; raises DriftkvError."""
        t = V.timeout(timeout)
        t = self.timeout if t is None else t
        error = None
        for n, sleep in enumerate(self.retry.sleeps(idempotent)):
            if n > 0:
                with self._retries_lock:
                    self.retries += 1
                time.sleep(sleep)
            try:
                return attempt(t)
            except grpc.RpcError as e:
                if self._closed:
                    raise closed_error(self, grpc.StatusCode.CANCELLED) from None
                error = e
                if not retryable(e):
                    break
            except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
                if self._closed:
                    raise closed_error(self, grpc.StatusCode.CANCELLED) from None
                raise
        raise DriftkvError.from_rpc(error)

    # -- methods ----------------------------------------------------------

    def info(self, *, timeout: Optional[float] = None) -> Info:
        """The server's model shape, codec, limits and hot tier (asked anew)."""
        V.timeout(timeout)
        stub = self._connect()
        return from_message(Info, self._call(True, lambda t: stub.Info(pb.InfoRequest(), timeout=t), timeout))

    def stats(self, *, timeout: Optional[float] = None) -> Stats:
        V.timeout(timeout)
        stub = self._connect()
        return from_message(Stats, self._call(True, lambda t: stub.Stats(pb.StatsRequest(), timeout=t), timeout))

    def length(self, sequence_id: str, *, timeout: Optional[float] = None) -> List[LayerLength]:
        """Each layer's stored tokens (compressed + window), layer 0 first.
        NOT_FOUND for an unknown sequence."""
        req = pb.LengthRequest(sequence_id=V.text(sequence_id, "sequence_id"))
        V.timeout(timeout)
        stub = self._connect()
        return W.lengths(self._call(True, lambda t: stub.Length(req, timeout=t), timeout))

    def prefetch(self, sequence_id: str, *, timeout: Optional[float] = None) -> int:
        """Brings the sequence's pages back into the server's pool from the
        disk level below it (docs/tiers.md), before the Attend a scheduler
        is about to send; returns the pages brought back (0: all were there,
        or the server has no disk level). NOT_FOUND for an unknown
        sequence, DATA_LOSS for a page that did not come back intact."""
        req = pb.PrefetchRequest(sequence_id=V.text(sequence_id, "sequence_id"))
        V.timeout(timeout)
        stub = self._connect()
        return int(self._call(True, lambda t: stub.Prefetch(req, timeout=t), timeout).pages_restored)

    def append(self, sequence_id: str, layer: int, keys, values, *, first_token: int = 0,
               wire_dtype: Optional[str] = None, chunk_tokens: int = W.DEFAULT_CHUNK_TOKENS,
               progress: Optional[Progress] = None, timeout: Optional[float] = None,
               token_ids: Optional[Sequence[int]] = None) -> AppendResult:
        """Stores keys and values [tokens, kv_heads, head_dim] of one layer
        from first_token on, in chunks of chunk_tokens, in one Append call.
        token_ids (one per token) name the sequence's full pages in the
        server's prefix index, for lookup and fork_from_prefix."""
        return self.append_chunks(W.split_layer(sequence_id, layer, keys, values, first_token, chunk_tokens,
                                                wire_dtype, token_ids), progress=progress, timeout=timeout)

    def append_chunks(self, chunks: Iterable[Chunk], *, progress: Optional[Progress] = None,
                      timeout: Optional[float] = None) -> AppendResult:
        """Streams chunks, in order, in one Append call; the iterable may
        produce them while a prefill runs (it is read as gRPC sends). The
        first rejected chunk ends the call with DriftkvError naming its
        position; the chunks before it stay stored (Length says how much).
        Retried on UNAVAILABLE: the chunks already sent are sent again (the
        server acknowledges stored tokens without storing them twice), so
        they are kept until the call ends. progress(chunks, tokens) is called
        as each new chunk is handed to gRPC (from gRPC's sending thread).
        A list or tuple of chunks is checked whole before the call: a bad
        chunk raises DriftkvError(INVALID_ARGUMENT) and nothing is sent."""
        sender = W.ChunkSender(chunks, progress)
        V.timeout(timeout)
        stub = self._connect()
        result = self._call(True, lambda t: stub.Append(sender.stream(), timeout=t), timeout)
        sender.raise_failure()
        return W.append_result(result)

    def attend(self, items: Union[AttendItem, Sequence[AttendItem]], *, wire_dtype: Optional[str] = None,
               out: Optional[Array] = None, lse: Optional[Array] = None, output_dtype: Optional[str] = None,
               timeout: Optional[float] = None) -> Attention:
        """Attention of every item, one call: (output [items, q_heads,
        head_dim], lse [items, q_heads]) float32, as the first query's kind
        of array (numpy, or torch on its device). A single AttendItem gives
        (output [q_heads, head_dim], lse [q_heads]). Queries of one batch
        must share their shape (attend_results takes any). Every item is
        checked before anything is sent: a refused batch applied no decode
        step.

        out, lse: the caller's arrays of those shapes, filled and returned
        (both or neither). output_dtype "f32" or "bf16" (default: out's own,
        torch bfloat16 or numpy uint16 bf16 bits; else "f32"); without out a
        bf16 answer comes back widened to float32.

        The data plane (docs/python.md, "A decode loop on the fast path"):
        queries, new keys/values, out and lse that live in a registered host
        region (register_host_region) or are torch CUDA tensors go by
        reference, the server reading and writing them in place; the others
        travel inline. The answers are the same either way."""
        V.timeout(timeout)
        req, idempotent, finish = self.prepare_attend(items, wire_dtype=wire_dtype, out=out, lse=lse,
                                                      output_dtype=output_dtype)
        stub = self._connect()
        return finish(self._call(idempotent, lambda t: stub.Attend(req, timeout=t), timeout))

    def prepare_attend(self, items, *, wire_dtype: Optional[str] = None, out: Optional[Array] = None,
                       lse: Optional[Array] = None, output_dtype: Optional[str] = None):
        """(request, idempotent, finish) of attend(items, ...): the
        AttendRequest, whether repeating it is harmless, and finish(response)
        -> what attend returns. A pb.AttendRequest passes through as it is
        (not idempotent; finish returns the response). For attend_stream()
        and open_doorbell(), and callers that send one request many times."""
        plan = W.AttendPlan(items, out, lse, output_dtype, wire_dtype)
        if plan.request is not None:
            return plan.request, False, plan.finish
        req, idempotent = self._attend_request(plan.batch, wire_dtype, plan.dests, plan.output_dtype)
        return req, idempotent, plan.finish

    def attend_results(self, items: Sequence[AttendItem], *, wire_dtype: Optional[str] = None,
                       output_dtype: str = "f32", timeout: Optional[float] = None) -> List[AttendResult]:
        """Like attend, one AttendResult (output, lse, tokens,
        compressed_tokens) per item."""
        batch = W.results_batch(items, wire_dtype, output_dtype)
        return W.attend_results(batch, self._attend(batch, wire_dtype, timeout, None, output_dtype), output_dtype)

    def _attend_request(self, batch, wire_dtype, dests, output_dtype):
        self._connect()
        W.check_batch(len(batch), self._info.max_batch)
        return W.attend_request(batch, wire_dtype, self._places, dests, output_dtype)

    def _attend(self, batch, wire_dtype, timeout, dests=None, output_dtype="f32"):
        """One Attend of a batch checked already (AttendPlan, results_batch)."""
        V.timeout(timeout)
        stub = self._connect()
        req, idempotent = self._attend_request(batch, wire_dtype, dests, output_dtype)
        return self._call(idempotent, lambda t: stub.Attend(req, timeout=t), timeout)

    def read(self, sequence_id: str, layer: int, *, first_token: int = 0, token_count: int = 0,
             wire_dtype: str = "f32", timeout: Optional[float] = None) -> ReadResult:
        """The stored keys and values of tokens [first_token, first_token +
        token_count) (0: to the end) as float32 [tokens, kv_heads,
        head_dim], page tokens decoded. A retry resumes after the last chunk
        received."""
        request = W.read_request(sequence_id, layer, first_token, token_count, wire_dtype)
        V.timeout(timeout)
        stub = self._connect()
        chunks = []

        def attempt(t):
            resumed = W.resumed_read(request, chunks[-1].first_token + chunks[-1].token_count if chunks
                                     else request.first_token)
            if resumed is None:
                return None
            call = stub.Read(resumed, timeout=t)
            try:
                for c in call:
                    chunks.append(c)
            except BaseException:  # KeyboardInterrupt included: the stream ends here, not when collected
                call.cancel()
                raise

        self._call(True, attempt, timeout)
        return W.read_result(chunks, self._info)

    def release(self, sequence_id: str, *, timeout: Optional[float] = None) -> ReleaseResult:
        """Frees a sequence. A repeat after a lost answer that finds nothing
        (NOT_FOUND) means the first attempt freed it: reported as success
        with unknown counts (0, 0)."""
        req = pb.ReleaseRequest(sequence_id=V.text(sequence_id, "sequence_id"))
        V.timeout(timeout)
        stub = self._connect()
        tries = [0]

        def attempt(t):
            tries[0] += 1
            try:
                return stub.Release(req, timeout=t)
            except grpc.RpcError as e:
                if tries[0] > 1 and e.code() == grpc.StatusCode.NOT_FOUND:
                    return pb.ReleaseResponse()
                raise

        r = self._call(True, attempt, timeout)
        return ReleaseResult(r.tokens_freed, r.pages_freed)

    def fork(self, source_sequence_id: str, sequence_id: str, tokens: int, *, new_incarnation: bool = False,
             timeout: Optional[float] = None) -> ForkResult:
        """Creates sequence_id sharing the first `tokens` tokens of every
        layer of source_sequence_id by reference (docs/python.md, "Fork"):
        `tokens` a multiple of page_tokens (Info), at most the tokens in
        pages of each of the source's layers. Append to the new sequence from
        token `tokens` on. Never retried: a repeat after a lost answer would
        be ALREADY_EXISTS; length(sequence_id) tells whether it was made."""
        req = W.fork_request(source_sequence_id, sequence_id, tokens, new_incarnation)
        V.timeout(timeout)
        stub = self._connect()
        return W.fork_result(self._call(False, lambda t: stub.Fork(req, timeout=t), timeout))

    def lookup(self, token_ids: Optional[Sequence[int]] = None, *, page_keys: Optional[Sequence[bytes]] = None,
               timeout: Optional[float] = None) -> LookupResult:
        """The longest prefix of a prompt (its token ids, or its page keys
        from driftkv.prefix.page_keys) that the server's prefix index holds
        for this client's tenant, per layer and overall, and why the next
        page is not held (docs/python.md, "Prefix cache"). Retried:
        read-only."""
        req = W.lookup_request(token_ids, page_keys)
        V.timeout(timeout)
        stub = self._connect()
        return W.lookup_result(self._call(True, lambda t: stub.Lookup(req, timeout=t), timeout))

    def fork_from_prefix(self, sequence_id: str, token_ids: Optional[Sequence[int]] = None, *,
                         page_keys: Optional[Sequence[bytes]] = None, max_tokens: int = 0,
                         new_incarnation: bool = False, timeout: Optional[float] = None) -> ForkResult:
        """Creates sequence_id sharing the longest prefix of the prompt that
        the prefix index holds in every layer (at most max_tokens unless 0);
        ForkResult.tokens says how many: append from there. NOT_FOUND when
        none is held. Never retried, like fork."""
        req = W.fork_prefix_request(sequence_id, token_ids, page_keys, max_tokens, new_incarnation)
        V.timeout(timeout)
        stub = self._connect()
        return W.fork_result(self._call(False, lambda t: stub.Fork(req, timeout=t), timeout))

    def pin(self, pin_id: str, token_ids: Optional[Sequence[int]] = None, *,
            page_keys: Optional[Sequence[bytes]] = None, ttl_seconds: float, max_tokens: int = 0,
            timeout: Optional[float] = None) -> PinResult:
        """Keeps the longest prefix of the prompt that the prefix index holds
        in every layer (at most max_tokens, a multiple of page_tokens,
        unless 0) resident for ttl_seconds (at most a week), as pin_id of
        this client's tenant: eviction never frees its pages, and the tenant
        is charged for them until the lease ends or unpin (docs/python.md,
        "Pins and page events"). Pinning a live pin_id again replaces it
        (PinResult.replaced): that is how a lease is renewed. NOT_FOUND when
        nothing of the prompt is held, RESOURCE_EXHAUSTED naming the quota
        past the tenant's max_pages or max_bytes (a pin of that id already
        there stays). Retried: a repeat replaces the pin with itself."""
        req = W.pin_request(pin_id, token_ids, page_keys, ttl_seconds, max_tokens)
        V.timeout(timeout)
        stub = self._connect()
        return W.pin_result(self._call(True, lambda t: stub.Pin(req, timeout=t), timeout))

    def unpin(self, pin_id: str, *, timeout: Optional[float] = None) -> int:
        """Removes a pin of this client's tenant before its lease ends;
        returns the page references it gave back (all layers). NOT_FOUND
        when pin_id is not a live pin (never made, removed, lease over).
        Never retried: a repeat after a lost answer would be NOT_FOUND."""
        req = pb.UnpinRequest(pin_id=V.text(pin_id, "pin_id"))
        V.timeout(timeout)
        stub = self._connect()
        return int(self._call(False, lambda t: stub.Unpin(req, timeout=t), timeout).pages_unpinned)

    def watch_pages(self, *, max_batch: int = 0, buffer_events: int = 0,
                    timeout: Optional[float] = None) -> "PageWatch":
        """The prefix index's page events of this client's tenant from now
        on, as an iterator of PageEventBatch (driftkv.page_watch): at most
        max_batch events a batch (0: 256; at most 4096), buffered on the
        server up to buffer_events (0: 65536; at most 1048576) before it
        drops them (PageEventBatch.dropped, PageWatch.dropped). cancel() or
        the with block's end stops it. `timeout` bounds the whole stream
        (DEADLINE_EXCEEDED); None: no deadline, unlike the other calls.
        Never retried."""
        from driftkv.page_watch import PageWatch
        req = W.watch_request(max_batch, buffer_events)
        t = V.timeout(timeout)
        stub = self._connect()
        try:
            return PageWatch(self, stub.WatchPages(req, timeout=t))
        except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
            raise closed_error(self, grpc.StatusCode.CANCELLED) from None

    # -- memory regions (driftkv/regions.py) ---------------------------------

    def register_host_region(self, nbytes: int, **kwargs) -> "HostRegion":
        """A host shared-memory region of `nbytes` registered with the server
        (driftkv.regions.HostRegion; keyword arguments go there)."""
        from driftkv.regions import HostRegion
        region = HostRegion(self, nbytes, **kwargs)
        self._places.add_host(region)
        return region

    def register_cuda_region(self, tensor) -> "pb.TensorRef":
        """The TensorRef of a torch CUDA tensor, its allocation registered by
        CUDA IPC on first use (driftkv.regions.CudaRegions, one per client)."""
        return self._places.cuda().ref(tensor)

    # -- the data plane's channels (driftkv/attend_stream.py, doorbell.py) ----

    def attend_stream(self) -> "AttendStream":
        """A persistent AttendStream call: stream.attend(items or request,
        timeout=...) answers like attend, frames in order."""
        from driftkv.attend_stream import AttendStream
        return AttendStream(self)

    def open_doorbell(self, region: "HostRegion", offset: Optional[int] = None, **kwargs) -> "Doorbell":
        """A doorbell in `region` at `offset` (a multiple of 64; None: the
        region's next free bytes), for a client on the server's host
        (driftkv.doorbell.Doorbell; request_capacity and response_capacity
        go there)."""
        from driftkv.doorbell import Doorbell
        return Doorbell(self, region, offset, **kwargs)


def _repr(kind: str, target: str, security: Security, closed: bool) -> str:
    """"<driftkv.Client target='h:p' tls open>": the target, TLS or not and
    the state; never the token or the key."""
    tls = " tls" if security.tls_ca else ""
    return f"<{kind} target={target!r}{tls} {'closed' if closed else 'open'}>"
