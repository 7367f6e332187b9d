"""Requests built from arrays and answers turned back into arrays: the part
of the client shared by the sync and asyncio variants."""
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from driftkv import _tensors as T
from driftkv._crc32c import crc32c, crc32c_extend
from driftkv._errors import invalid
from driftkv._proto import pb
from driftkv._types import (AppendResult, AttendItem, AttendResult, Attention, Chunk, Info, LayerLength,
                            ReadResult)

# Tokens per Append message when the caller does not choose: 256 tokens of
# the eval model's 4 x 128 in f32 are 1 MiB of keys and values.
DEFAULT_CHUNK_TOKENS = 256


def channel_options(max_message_bytes: int) -> List[Tuple[str, int]]:
    """gRPC's own default receive limit is 4 MiB, less than a maximum-size
    Attend answer (1024 items x 8 heads x 128 x 4 bytes = 4.2 MB): the
    client takes the server's max_message_bytes for both directions."""
    return [("grpc.max_receive_message_length", int(max_message_bytes)),
            ("grpc.max_send_message_length", int(max_message_bytes))]


def _tensor3(name: str, x, where: str = "") -> Tuple[int, int, int]:
    s = T.shape(x)
    if len(s) != 3:
        raise invalid(f"{where}{name} has shape {s}; expected [tokens, kv_heads, head_dim]")
    return s


def chunk_message(c: Chunk) -> "pb.AppendChunk":
    """An AppendChunk with its shape fields set from the arrays (the server
    checks them: a wrong head layout is refused naming the field)."""
    ks = _tensor3("keys", c.keys)
    vs = _tensor3("values", c.values)
    if ks != vs:
        raise invalid(f"keys has shape {ks} but values has shape {vs}")
    wire = c.wire_dtype or T.natural_wire(c.keys)
    m = pb.AppendChunk(sequence_id=c.sequence_id, layer=c.layer, first_token=c.first_token,
                       token_count=ks[0], dtype=T.check_wire(wire), kv_heads=ks[1], head_dim=ks[2],
                       new_incarnation=c.new_incarnation)
    m.keys = T.to_wire(c.keys, wire)
    m.values = T.to_wire(c.values, wire)
    m.crc32c = crc32c_extend(crc32c(m.keys), m.values)
    return m


def split_layer(sequence_id: str, layer: int, keys, values, first_token: int, chunk_tokens: int,
                wire_dtype: Optional[str]) -> Iterable[Chunk]:
    """One layer's [tokens, kv_heads, head_dim] as chunks of chunk_tokens."""
    ks = _tensor3("keys", keys)
    if chunk_tokens < 1:
        raise invalid(f"chunk_tokens {chunk_tokens} must be >= 1")
    for t in range(0, ks[0], chunk_tokens):
        yield Chunk(sequence_id, layer, first_token + t, keys[t:t + chunk_tokens], values[t:t + chunk_tokens],
                    wire_dtype)


# progress(chunks, tokens): new chunks and tokens handed to gRPC so far.
Progress = Callable[[int, int], None]


class ChunkSender:
    """The request stream of one Append call over its attempts.

    Reads the caller's chunks lazily and keeps the messages sent, so that a
    retried attempt sends them again before going on (the server
    acknowledges stored tokens without storing them twice). A chunk that
    cannot be converted, or an exception of the caller's iterable, ends the
    stream there: the chunks before it are committed by the call, then
    raise_failure() raises it (gRPC would otherwise only log it).
    """

    def __init__(self, chunks: Iterable[Chunk], progress: Optional[Progress]):
        self._source = iter(chunks)
        self._progress = progress
        self._sent: List["pb.AppendChunk"] = []
        self._failure: Optional[BaseException] = None
        self._tokens = 0

    def _next(self):
        try:
            return chunk_message(next(self._source))
        except StopIteration:
            return None
        except Exception as e:  # noqa: BLE001 - re-raised by raise_failure
            self._failure = e
            return None

    def stream(self) -> Iterator["pb.AppendChunk"]:
        yield from list(self._sent)
        while self._failure is None:
            m = self._next()
            if m is None:
                return
            self._sent.append(m)
            self._tokens += m.token_count
            yield m
            if self._progress is not None:
                self._progress(len(self._sent), self._tokens)

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


def append_result(m) -> AppendResult:
    return AppendResult(m.chunks, m.tokens_stored, m.tokens_duplicate)


def attend_request(items: Sequence[AttendItem], wire_dtype: Optional[str]) -> Tuple["pb.AttendRequest", bool]:
    """The request and whether repeating it is harmless (no decode step
    without new_token_index)."""
    if len(items) == 0:
        raise invalid("items is empty; send at least one item")
    req = pb.AttendRequest()
    idempotent = True
    for i, it in enumerate(items):
        qs = T.shape(it.query)
        if len(qs) != 2:
            raise invalid(f"items[{i}].query has shape {qs}; expected [q_heads, head_dim]")
        wire = wire_dtype or T.natural_wire(it.query)
        m = req.items.add(sequence_id=it.sequence_id, layer=it.layer, dtype=T.check_wire(wire), q_heads=qs[0],
                          head_dim=qs[1])
        m.query = T.to_wire(it.query, wire)
        if (it.new_key is None) != (it.new_value is None):
            raise invalid(f"items[{i}]: new_key and new_value go together (both or neither)")
        if it.new_key is not None:
            for name, x in (("new_key", it.new_key), ("new_value", it.new_value)):
                s = T.shape(x)
                if len(s) != 2 or s[1] != qs[1]:
                    raise invalid(f"items[{i}].{name} has shape {s}; expected [kv_heads, {qs[1]}]")
            m.new_key = T.to_wire(it.new_key, wire)
            m.new_value = T.to_wire(it.new_value, wire)
            if it.new_token_index is None:
                idempotent = False
            else:
                m.new_token_index = it.new_token_index
        elif it.new_token_index is not None:
            raise invalid(f"items[{i}].new_token_index {it.new_token_index} is set but new_key/new_value are not")
        if it.softmax_scale is not None:
            m.softmax_scale = it.softmax_scale
    return req, idempotent


def attend_results(items: Sequence[AttendItem], response) -> List[AttendResult]:
    out = []
    for it, r in zip(items, response.results):
        q, d = T.shape(it.query)
        o = np.frombuffer(r.output, dtype="<f4").astype(np.float32).reshape(q, d)
        lse = np.asarray(r.lse, dtype=np.float32)
        out.append(AttendResult(T.like(it.query, o), T.like(it.query, lse), r.tokens, r.compressed_tokens))
    return out


def stacked(items: Sequence[AttendItem], response) -> Attention:
    """(output [items, q_heads, head_dim], lse [items, q_heads]) as the first
    query's kind of array."""
    shapes = {T.shape(it.query) for it in items}
    if len(shapes) != 1:
        raise invalid(f"items have queries of shapes {sorted(shapes)}; attend() stacks equal shapes only, "
                      "attend_results() takes any")
    q, d = shapes.pop()
    o = np.empty((len(items), q, d), dtype=np.float32)
    lse = np.empty((len(items), q), dtype=np.float32)
    for i, r in enumerate(response.results):
        o[i] = np.frombuffer(r.output, dtype="<f4").reshape(q, d)
        lse[i] = r.lse
    return Attention(T.like(items[0].query, o), T.like(items[0].query, lse))


def read_request(sequence_id: str, layer: int, first_token: int, token_count: int, wire_dtype: str):
    return pb.ReadRequest(sequence_id=sequence_id, layer=layer, first_token=first_token, token_count=token_count,
                          dtype=T.check_wire(wire_dtype))


def resumed_read(request, next_token: int):
    """The request for what is left after the chunks received up to next_token;
    None when nothing is left."""
    r = pb.ReadRequest()
    r.CopyFrom(request)
    r.first_token = next_token
    if request.token_count:
        done = next_token - request.first_token
        if done >= request.token_count:
            return None
        r.token_count = request.token_count - done
    return r


def read_result(chunks, info: Info) -> ReadResult:
    per = (info.kv_heads, info.head_dim)
    keys = [T.from_wire(c.keys, c.dtype, (c.token_count,) + per) for c in chunks]
    values = [T.from_wire(c.values, c.dtype, (c.token_count,) + per) for c in chunks]
    empty = np.zeros((0,) + per, dtype=np.float32)
    return ReadResult(np.concatenate(keys) if keys else empty, np.concatenate(values) if values else empty,
                      sum(c.compressed_tokens for c in chunks))


def lengths(response) -> List[LayerLength]:
    return [LayerLength(l.tokens, l.compressed_tokens, l.window_tokens) for l in response.layers]
