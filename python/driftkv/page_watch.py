"""driftkv.page_watch: the WatchPages stream (proto/driftkv.proto,
PageEventBatch; docs/prefix_cache.md, "Events for routers") as an
iterator of driftkv.PageEventBatch, sync (PageWatch) and asyncio
(AsyncPageWatch). Made by Client.watch_pages().

The server subscribes when it runs the call, which the client does not
see: events from before that moment are not sent, so a router that needs
a complete picture rebuilds it with lookup after subscribing (as after a
batch with `dropped`). The stream has no deadline unless the caller gave
one; it ends when the caller cancels it: cancel() (from any thread or
task, or the with block's end) makes the iteration stop cleanly. Any
other end raises DriftkvError: the server's status (RESOURCE_EXHAUSTED
past its subscribers, CANCELLED when it shuts down), DEADLINE_EXCEEDED at
the caller's deadline, CANCELLED when the client is closed. Never
retried: subscribe again and rebuild.
"""
import asyncio

import grpc
import grpc.aio

from driftkv import _wire as W
from driftkv._errors import DriftkvError, closed_error
from driftkv._types import PageEventBatch


class _Watch:
    """What the sync and asyncio watches share: the call, whether the
    caller cancelled it, and the count of events missed."""

    def __init__(self, client, call):
        self._client = client
        self._call = call
        self._cancelled = False
        self._ended = False
        self.dropped = 0  # events the server dropped for this watch, over the batches read so far

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Ends the stream (again: nothing). An iteration blocked in another
        thread or task, and every later one, stops without an error."""
        self._cancelled = True
        self._call.cancel()

    close = cancel

    def _batch(self, m) -> PageEventBatch:
        b = W.page_event_batch(m)
        self.dropped += b.dropped
        return b

    def _error(self, e: BaseException) -> DriftkvError:
        """What a failed read raises when the caller did not cancel."""
        if self._client.closed:
            return closed_error(self._client, grpc.StatusCode.CANCELLED)
        if isinstance(e, grpc.RpcError):
            return DriftkvError.from_rpc(e)
        return DriftkvError(grpc.StatusCode.UNKNOWN, f"WatchPages: {e!r}")


class PageWatch(_Watch):
    """for batch in client.watch_pages(): ... (see the module's header)."""

    def __iter__(self) -> "PageWatch":
        return self

    def __next__(self) -> PageEventBatch:
        if self._ended or self._cancelled:
            raise StopIteration
        try:
            m = next(self._call)
        except StopIteration:
            self._ended = True
            raise
        except (grpc.RpcError, ValueError) as e:  # ValueError: gRPC's "closed channel"
            self._ended = True
            if self._cancelled:
                raise StopIteration from None
            raise self._error(e) from None
        except BaseException:  # KeyboardInterrupt: the server's call ends now, not when collected
            self.cancel()
            raise
        return self._batch(m)

    def __enter__(self) -> "PageWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class AsyncPageWatch(_Watch):
    """async for batch in await client.watch_pages(): ... (see the
    module's header). Cancelling the task that awaits a batch cancels the
    call too."""

    def __aiter__(self) -> "AsyncPageWatch":
        return self

    async def __anext__(self) -> PageEventBatch:
        if self._ended or self._cancelled:
            raise StopAsyncIteration
        try:
            m = await self._call.read()
        except asyncio.CancelledError:
            # grpc.aio raises this both when cancel() cancelled the call and
            # when the awaiting task itself is cancelled.
            self._ended = True
            if self._cancelled:
                raise StopAsyncIteration from None
            self._call.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - grpc.aio's AioRpcError, UsageError on a closed channel
            self._ended = True
            if self._cancelled:
                raise StopAsyncIteration from None
            raise self._error(e) from None
        if m is grpc.aio.EOF:
            self._ended = True
            code = await self._call.code()
            if self._cancelled or code == grpc.StatusCode.OK:
                raise StopAsyncIteration
            raise DriftkvError(code, await self._call.details() or "")
        return self._batch(m)

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> "AsyncPageWatch":
        return self

    async def __aexit__(self, *exc) -> None:
        self.cancel()
