"""Requests built from arrays and answers turned back into arrays: the part
of the client shared by the sync and asyncio variants."""
import sys
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from driftkv import _tensors as T
from driftkv import _validate as V
from driftkv._crc32c import crc32c, crc32c_extend
from driftkv._errors import invalid
from driftkv._proto import pb
from driftkv._types import (AppendResult, Array, AttendItem, AttendResult, Attention, Chunk, ForkResult, Info,
                            LayerLength, LookupResult, PageEvent, PageEventBatch, PinResult, ReadResult)

# Tokens per Append message when the caller does not choose: 256 tokens of
# the eval model's 4 x 128 in f32 are 1 MiB of keys and values.
DEFAULT_CHUNK_TOKENS = 256


def channel_options(max_message_bytes: int) -> List[Tuple[str, int]]:
    """gRPC's own default receive limit is 4 MiB, less than a maximum-size
    Attend answer (1024 items x 8 heads x 128 x 4 bytes = 4.2 MB): the
    client takes the server's max_message_bytes for both directions."""
    return [("grpc.max_receive_message_length", int(max_message_bytes)),
            ("grpc.max_send_message_length", int(max_message_bytes))]


def chunk_message(c: Chunk, where: str = "chunk", checked: bool = False) -> "pb.AppendChunk":
    """An AppendChunk with its shape fields set from the arrays (the server
    checks them: a wrong head layout is refused naming the field). The
    chunk is checked first (driftkv._validate) unless `checked` says it was."""
    ks = T.shape(c.keys) if checked else V.chunk(c, where)
    wire = c.wire_dtype or T.natural_wire(c.keys)
    m = pb.AppendChunk(sequence_id=c.sequence_id, layer=int(c.layer), first_token=int(c.first_token),
                       token_count=ks[0], dtype=T.check_wire(wire), kv_heads=ks[1], head_dim=ks[2],
                       new_incarnation=bool(c.new_incarnation))
    m.keys = T.to_wire(c.keys, wire)
    m.values = T.to_wire(c.values, wire)
    m.crc32c = crc32c_extend(crc32c(m.keys), m.values)
    if c.token_ids is not None:
        m.token_ids.extend(int(i) for i in c.token_ids)
    return m


def split_layer(sequence_id: str, layer: int, keys, values, first_token: int, chunk_tokens: int,
                wire_dtype: Optional[str], token_ids=None) -> List[Chunk]:
    """One layer's [tokens, kv_heads, head_dim] as chunks of chunk_tokens
    (views, not copies), every argument checked before any is made;
    `token_ids` (one per token, or None) split alike."""
    ks = V.layer_arrays(sequence_id, layer, keys, values, first_token, chunk_tokens, wire_dtype)
    ids = None if token_ids is None else V.token_ids(token_ids, "token_ids", ks[0])
    return [Chunk(sequence_id, layer, first_token + t, keys[t:t + chunk_tokens], values[t:t + chunk_tokens],
                  wire_dtype, token_ids=None if ids is None else ids[t:t + chunk_tokens])
            for t in range(0, ks[0], chunk_tokens)]


# progress(chunks, tokens): new chunks and tokens handed to gRPC so far.
Progress = Callable[[int, int], None]


class ChunkSender:
    """The request stream of one Append call over its attempts.

    Reads the caller's chunks lazily and keeps the messages sent, so that a
    retried attempt sends them again before going on (the server
    acknowledges stored tokens without storing them twice). Chunks given as
    a list or tuple are checked, all of them, here, before the call starts
    (a bad one raises DriftkvError and nothing is sent); an iterator's are
    checked as they are read. A chunk of an iterator that fails its check
    or cannot be converted, or an exception of the iterator, ends the
    stream there: the chunks before it are committed by the call, then
    raise_failure() raises it (gRPC would otherwise only log it).
    """

    def __init__(self, chunks: Iterable[Chunk], progress: Optional[Progress]):
        self._checked = isinstance(chunks, (list, tuple))
        self._source = iter(V.chunks(chunks) if self._checked else chunks)
        self._progress = progress
        self._sent: List["pb.AppendChunk"] = []
        self._failure: Optional[BaseException] = None
        self._tokens = 0

    def _next(self):
        try:
            return chunk_message(next(self._source), f"chunks[{len(self._sent)}]", self._checked)
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


# Where one item's answer goes: (output [q_heads, head_dim], lse [q_heads])
# arrays of the caller, or None for arrays made here.
Destination = Optional[Tuple[Array, Array]]
OUTPUT_DTYPES = {"f32": pb.DTYPE_F32, "bf16": pb.DTYPE_BF16}


def output_dtype_of(out, output_dtype: Optional[str]) -> str:
    """The output dtype asked for, else the destination's own (torch
    bfloat16 and numpy uint16 bf16 bits: "bf16"), else "f32"."""
    own = None
    if out is not None:
        if T.is_torch(out):
            own = "bf16" if out.dtype == sys.modules["torch"].bfloat16 else "f32"
        elif np.asarray(out).dtype == np.uint16:
            own = "bf16"
    if output_dtype is None:
        return own or "f32"
    check_output_dtype(output_dtype)
    if own == "bf16" and output_dtype != "bf16":
        raise invalid(f"out holds bf16 but output_dtype is {output_dtype!r}")
    return output_dtype


def check_output_dtype(output_dtype: str) -> int:
    if output_dtype not in OUTPUT_DTYPES:
        raise invalid(f"output_dtype {output_dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}")
    return OUTPUT_DTYPES[output_dtype]


def destinations(n: int, single: bool, out, lse) -> Optional[List[Destination]]:
    """The per-item (output, lse) views of the caller's out [items, q_heads,
    head_dim] and lse [items, q_heads] (without the item axis for a single
    item); None when neither is given. Both or neither."""
    if out is None and lse is None:
        return None
    if out is None or lse is None:
        raise invalid("out and lse go together (both or neither)")
    V.destination(out, "out", bf16_bits=True)
    V.destination(lse, "lse", bf16_bits=False)
    if single:
        return [(out, lse)]
    if T.shape(out)[:1] != (n,) or T.shape(lse)[:1] != (n,):
        raise invalid(f"out has shape {T.shape(out)} and lse {T.shape(lse)}; both need {n} items first")
    return [(out[i], lse[i]) for i in range(n)]


def check_batch(n: int, max_batch: int) -> None:
    if n > max_batch:
        raise invalid(f"items has {n} entries; the server's max_batch is {max_batch}")


def item_list(items) -> List[AttendItem]:
    if isinstance(items, AttendItem):
        return [items]
    try:
        return list(items)
    except TypeError:
        raise invalid(f"items is a {type(items).__name__}; expected an AttendItem or a list of them") from None


def results_batch(items, wire_dtype: Optional[str], output_dtype: str) -> List[AttendItem]:
    """attend_results()'s items as a list, every item checked (queries of
    any shapes) before anything is sent."""
    batch = item_list(items)
    check_output_dtype(output_dtype)
    V.attend_items(batch, wire_dtype, stack=False)
    return batch


class AttendPlan:
    """attend(items, out=, lse=, output_dtype=) before and after its call,
    shared by the sync and asyncio clients: `batch`, `output_dtype` and the
    per-item destinations `dests` to build the request from, and finish(
    response), what attend returns. Every argument is checked here, before
    anything is sent (driftkv._validate), the stacking of the answers
    included: the queries of a list share one shape. A pb.AttendRequest
    passes through as `request`, unchecked (finish then returns the
    response as it is)."""

    def __init__(self, items, out, lse, output_dtype: Optional[str], wire_dtype: Optional[str] = None):
        self.request = items if isinstance(items, pb.AttendRequest) else None
        if self.request is not None:
            return
        self.single = isinstance(items, AttendItem)
        self.batch: List[AttendItem] = item_list(items)
        self.dests = destinations(len(self.batch), self.single, out, lse)
        self.output_dtype = output_dtype_of(out, output_dtype)
        V.attend_items(self.batch, wire_dtype, stack=not self.single, dests=self.dests)
        self._out, self._lse = out, lse

    def finish(self, response):
        if self.request is not None:
            return response
        if self.dests is not None:
            fill(self.batch, response, self.output_dtype, self.dests)
            return Attention(self._out, self._lse)
        out = stacked(self.batch, response, self.output_dtype)
        return Attention(out.output[0], out.lse[0]) if self.single else out


def _ref_or_inline(m, field: str, x, wire: str, places) -> None:
    ref = places.ref(x, wire) if places is not None else None
    if ref is not None:
        getattr(m, field + "_ref").CopyFrom(ref)
    else:
        setattr(m, field, T.to_wire(x, wire))


def attend_request(items: Sequence[AttendItem], wire_dtype: Optional[str], places=None,
                   dests: Optional[Sequence[Destination]] = None,
                   output_dtype: str = "f32") -> Tuple["pb.AttendRequest", bool]:
    """The request and whether repeating it is harmless (no decode step
    without new_token_index), from items checked already (AttendPlan,
    results_batch). With `places` (driftkv._refs.Places), tensors
    already in registered memory go by reference (query_ref, new_key_ref,
    new_value_ref) and destinations there become output_ref/lse_ref; the
    others travel inline and stacked() copies their answers."""
    out_enum = check_output_dtype(output_dtype)
    req = pb.AttendRequest()
    idempotent = True
    for i, it in enumerate(items):
        qs = T.shape(it.query)
        wire = wire_dtype or T.natural_wire(it.query)
        m = req.items.add(sequence_id=it.sequence_id, layer=int(it.layer), dtype=T.check_wire(wire),
                          q_heads=qs[0], head_dim=qs[1])
        if out_enum != pb.DTYPE_F32:
            m.output_dtype = out_enum
        _ref_or_inline(m, "query", it.query, wire, places)
        if it.new_key is not None:
            for name, x in (("new_key", it.new_key), ("new_value", it.new_value)):
                _ref_or_inline(m, name, x, wire, places)
            if it.new_token_index is None:
                idempotent = False
            else:
                m.new_token_index = int(it.new_token_index)
        if it.softmax_scale is not None:
            m.softmax_scale = float(it.softmax_scale)
        if dests is not None and dests[i] is not None:
            out, lse = dests[i]
            out_ref = places.ref(out, output_dtype, output=True) if places is not None else None
            lse_ref = places.ref(lse, "f32", output=True) if out_ref is not None else None
            if lse_ref is not None:  # both by reference or neither (the server's rule)
                m.output_ref.CopyFrom(out_ref)
                m.lse_ref.CopyFrom(lse_ref)
    return req, idempotent


def _output(r, output_dtype: str, q: int, d: int) -> np.ndarray:
    """An inline answer's output as float32 [q, d] (bf16 widened exactly)."""
    if output_dtype == "bf16":
        return T.bf16_bits_to_f32(np.frombuffer(r.output, dtype="<u2")).reshape(q, d)
    return np.frombuffer(r.output, dtype="<f4").reshape(q, d)


def _store(dest, r, output_dtype: str, q: int, d: int) -> None:
    """Copies an inline answer into the caller's arrays; nothing when the
    server wrote them (output and lse by reference come back empty)."""
    out, lse = dest
    if r.output:
        if output_dtype == "bf16" and isinstance(out, np.ndarray) and out.dtype == np.uint16:
            out[...] = np.frombuffer(r.output, dtype="<u2").reshape(q, d)
        else:
            _assign(out, _output(r, output_dtype, q, d))
    if len(r.lse):
        _assign(lse, np.asarray(r.lse, dtype=np.float32))


def _assign(dst, src: np.ndarray) -> None:
    if T.is_torch(dst):
        torch = sys.modules["torch"]
        # from_numpy wants a writable array (the answer's may be a view of
        # read-only bytes): copied only then.
        dst.copy_(torch.from_numpy(np.require(src, requirements=["C", "W"])))
    else:
        dst[...] = src


def attend_results(items: Sequence[AttendItem], response, output_dtype: str = "f32",
                   dests: Optional[Sequence[Destination]] = None) -> List[AttendResult]:
    out = []
    for i, (it, r) in enumerate(zip(items, response.results)):
        q, d = T.shape(it.query)
        if dests is not None and dests[i] is not None:
            _store(dests[i], r, output_dtype, q, d)
            out.append(AttendResult(dests[i][0], dests[i][1], r.tokens, r.compressed_tokens))
            continue
        o = _output(r, output_dtype, q, d).astype(np.float32)
        lse = np.asarray(r.lse, dtype=np.float32)
        out.append(AttendResult(T.like(it.query, o), T.like(it.query, lse), r.tokens, r.compressed_tokens))
    return out


def fill(items: Sequence[AttendItem], response, output_dtype: str, dests: Sequence[Destination]) -> None:
    """Copies the inline answers into the caller's destinations (those the
    server wrote by reference are left as they are)."""
    for it, r, dest in zip(items, response.results, dests):
        q, d = T.shape(it.query)
        _store(dest, r, output_dtype, q, d)


def stacked(items: Sequence[AttendItem], response, output_dtype: str = "f32") -> Attention:
    """(output [items, q_heads, head_dim], lse [items, q_heads]) float32 as
    the first query's kind of array; the queries share one shape
    (AttendPlan checked it before the call)."""
    q, d = T.shape(items[0].query)
    o = np.empty((len(items), q, d), dtype=np.float32)
    lse = np.empty((len(items), q), dtype=np.float32)
    for i, r in enumerate(response.results):
        o[i] = _output(r, output_dtype, q, d)
        lse[i] = r.lse
    return Attention(T.like(items[0].query, o), T.like(items[0].query, lse))


def read_request(sequence_id: str, layer: int, first_token: int, token_count: int, wire_dtype: str):
    return pb.ReadRequest(sequence_id=V.text(sequence_id, "sequence_id"), layer=V.integer(layer, "layer"),
                          first_token=V.integer(first_token, "first_token", high=V.UINT64_MAX),
                          token_count=V.integer(token_count, "token_count"), dtype=T.check_wire(wire_dtype))


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


def fork_request(source_sequence_id: str, sequence_id: str, tokens: int, new_incarnation: bool):
    """The ForkRequest, its fields checked (the server checks tokens against
    page_tokens and the source's layers)."""
    if not isinstance(new_incarnation, bool):
        raise invalid(f"new_incarnation is {new_incarnation!r}; expected a bool")
    return pb.ForkRequest(source_sequence_id=V.text(source_sequence_id, "source_sequence_id"),
                          sequence_id=V.text(sequence_id, "sequence_id"),
                          tokens=V.integer(tokens, "tokens", 1, V.UINT64_MAX), new_incarnation=new_incarnation)


def fork_result(response) -> ForkResult:
    return ForkResult(lengths(response), response.pages_shared, response.tokens)


def prompt_fields(token_ids, page_keys, ids_field: str, keys_field: str) -> dict:
    """The prompt of a Lookup or a Fork from a prefix as request fields:
    exactly one of token_ids (uint32s) and page_keys (16-byte keys,
    driftkv.prefix.page_keys)."""
    if (token_ids is None) == (page_keys is None):
        raise invalid(f"pass one of {ids_field} and {keys_field}")
    if token_ids is not None:
        return {ids_field: V.token_ids(token_ids, ids_field)}
    keys = list(page_keys)
    for n, k in enumerate(keys):
        if not isinstance(k, (bytes, bytearray)) or len(k) != 16:
            raise invalid(f"{keys_field}[{n}] is not 16 bytes; page keys are driftkv.prefix.page_keys' bytes")
    return {keys_field: [bytes(k) for k in keys]}


def fork_prefix_request(sequence_id: str, token_ids, page_keys, max_tokens: int, new_incarnation: bool):
    """The ForkRequest of a fork from a prefix, its fields checked."""
    if not isinstance(new_incarnation, bool):
        raise invalid(f"new_incarnation is {new_incarnation!r}; expected a bool")
    return pb.ForkRequest(sequence_id=V.text(sequence_id, "sequence_id"),
                          tokens=V.integer(max_tokens, "max_tokens", 0, V.UINT64_MAX),
                          new_incarnation=new_incarnation,
                          **prompt_fields(token_ids, page_keys, "prefix_token_ids", "prefix_page_keys"))


def lookup_request(token_ids, page_keys):
    return pb.LookupRequest(**prompt_fields(token_ids, page_keys, "token_ids", "page_keys"))


_MISS = {0: "none", 1: "never_stored", 2: "evicted", 3: "unhashed", 4: "diverged"}


def lookup_result(r) -> LookupResult:
    return LookupResult(r.prompt_pages, r.pages, r.tokens, list(r.layer_pages), _MISS.get(r.miss_reason, "unknown"),
                        r.miss_page, r.miss_layer, r.miss_message)


def pin_request(pin_id: str, token_ids, page_keys, ttl_seconds, max_tokens: int):
    """The PinRequest, its fields checked (the server checks the lease's
    upper bound and max_tokens against page_tokens)."""
    return pb.PinRequest(pin_id=V.text(pin_id, "pin_id"), ttl_seconds=V.lease(ttl_seconds, "ttl_seconds"),
                         tokens=V.integer(max_tokens, "max_tokens", 0, V.UINT64_MAX),
                         **prompt_fields(token_ids, page_keys, "prefix_token_ids", "prefix_page_keys"))


def pin_result(r) -> PinResult:
    return PinResult(r.tokens, r.pages_pinned, r.expire_unix_ms, r.replaced)


# WatchPagesRequest's bounds (proto/driftkv.proto): events per message and
# the subscriber's buffer on the server; 0 takes the server's default.
MAX_WATCH_BATCH = 4096
MAX_WATCH_BUFFER = 1 << 20


def watch_request(max_batch: int, buffer_events: int):
    return pb.WatchPagesRequest(max_batch=V.integer(max_batch, "max_batch", 0, MAX_WATCH_BATCH),
                                buffer_events=V.integer(buffer_events, "buffer_events", 0, MAX_WATCH_BUFFER))


_EVENT = {1: "stored", 2: "evicted"}


def page_event_batch(m) -> PageEventBatch:
    return PageEventBatch([PageEvent(_EVENT.get(e.kind, "unknown"), bytes(e.page_key), e.layer) for e in m.events],
                          m.dropped)
