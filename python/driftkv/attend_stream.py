"""driftkv.attend_stream.AttendStream: Attend over one long-lived
AttendStream call (proto/driftkv.proto, AttendFrame; service/attend_stream.h),
so that a decode loop pays the call's setup once, not once per layer.

Frames go out through a request iterator fed from a queue and are answered
in order, each with its own status: a frame's error raises DriftkvError
with the server's code and message and leaves the stream usable; the end of
the call itself (the server gone, the channel closed) raises UNAVAILABLE
and breaks it (open another). A frame is never retried: it may hold a
decode step. Thread-safe: concurrent attend() calls are sent one at a time.
"""
import queue
import threading
from typing import Optional

import grpc

from driftkv import _validate as V
from driftkv._errors import DriftkvError
from driftkv._proto import pb

_END = object()  # ends the request iterator: the client half-closes
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def status_code(code: int) -> grpc.StatusCode:
    """A google.rpc.Code number (as frames and doorbells carry it) as a
    grpc.StatusCode; UNKNOWN for a number gRPC does not define."""
    return _CODES.get(code, grpc.StatusCode.UNKNOWN)


class AttendStream:
    """Made by Client.attend_stream(); close() (or the with block's end)
    half-closes the call and waits for its end."""

    def __init__(self, client):
        self._client = client
        self._frames: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 1
        self._broken: Optional[DriftkvError] = None
        self._closed = False
        self._call = client._connect().AttendStream(self._requests())

    def _requests(self):
        while True:
            frame = self._frames.get()
            if frame is _END:
                return
            yield frame

    def attend(self, request_or_items, *, timeout: Optional[float] = None, **kwargs):
        """Client.attend over the stream: items (one AttendItem or a list,
        with attend's keyword arguments wire_dtype, out, lse, output_dtype)
        give what attend gives; a pb.AttendRequest gives the
        pb.AttendResponse. `timeout` (seconds) is the frame's deadline on
        the server, from its arrival: a frame not started by then answers
        DEADLINE_EXCEEDED. Everything is checked before the frame is sent.
        KeyboardInterrupt while waiting cancels the call and breaks the
        stream (the frame's answer would be taken for the next one's)."""
        V.timeout(timeout)
        req, _, finish = self._client.prepare_attend(request_or_items, **kwargs)
        frame = pb.AttendFrame(request=req)
        if timeout is not None:
            frame.timeout_us = max(1, min(int(timeout * 1e6), 0xFFFFFFFF))
        with self._lock:
            if self._closed or self._broken is not None:
                raise self._broken or DriftkvError(grpc.StatusCode.UNAVAILABLE,
                                                   "the AttendStream is closed; open another")
            frame.frame_id = self._next_id
            self._next_id += 1
            self._frames.put(frame)
            try:
                result = next(self._call)
            except StopIteration:
                self._broken = DriftkvError(grpc.StatusCode.UNAVAILABLE, "the AttendStream ended")
                raise self._broken from None
            except grpc.RpcError as e:
                error = DriftkvError.from_rpc(e)
                self._broken = DriftkvError(grpc.StatusCode.UNAVAILABLE,
                                            f"the AttendStream ended: {error.details} ({error.code.name})")
                raise self._broken from None
            except BaseException:  # KeyboardInterrupt: frame_id's answer is still to come
                self._broken = DriftkvError(grpc.StatusCode.CANCELLED,
                                            f"the AttendStream was interrupted waiting for frame {frame.frame_id}; "
                                            "open another")
                self._call.cancel()
                raise
        if result.frame_id != frame.frame_id:
            raise DriftkvError(grpc.StatusCode.INTERNAL,
                               f"answer for frame {result.frame_id} while waiting for {frame.frame_id}")
        if result.code != 0:
            raise DriftkvError(status_code(result.code), result.message)
        return finish(result.response)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._frames.put(_END)
            if self._broken is None:
                try:
                    for _ in self._call:
                        pass
                except grpc.RpcError:
                    pass
            self._call.cancel()

    def __enter__(self) -> "AttendStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
