"""The client's checks of its arguments, run before anything is sent.

Guarantee (docs/python.md, "Errors"): a call the client can refuse is
refused whole, before its first byte leaves (before the channel is even
opened), with DriftkvError(INVALID_ARGUMENT) whose details name the field
and the value, as the server's do: "items[3].query has shape (32, 64);
expected (32, 128) like items[0].query". So a refused Attend applied no
decode step and a refused Append stored nothing; the caller can fix the
arguments and call again without storing a token twice. The one exception
is an Append fed by an iterator (a generator running beside the prefill):
its chunks are checked as they are read, and a bad one ends the stream
with the chunks before it stored (as an exception of the iterator does).

What is checked here is everything the client itself would otherwise fail
on after sending, or fail on with another exception type: types (a list
where an array goes), ranks and shapes, dtypes (inputs are floating-point
arrays; integer arrays, bf16 bit patterns in uint16 included, are refused
rather than converted by value), wire and output dtypes, integer ranges of
the proto's fields, destinations and timeouts. Rules only the server knows
(its head layout, max_batch before the first connection, sequence ids it
holds) stay the server's; it refuses a whole request before applying any
of it (service/handler.h).
"""
import numbers
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from driftkv import _tensors as T
from driftkv._errors import invalid
from driftkv._types import AttendItem, Chunk

UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1


def array(x: Any, where: str) -> Tuple[int, ...]:
    """The shape of a numpy array or torch tensor of a floating-point dtype."""
    if T.is_torch(x):
        if not x.is_floating_point():
            raise invalid(f"{where} has dtype {x.dtype}; expected a floating-point tensor")
    elif isinstance(x, np.ndarray):
        if x.dtype.kind != "f":
            raise invalid(f"{where} has dtype {x.dtype}; expected a floating-point array "
                          "(float32, float16 or float64)")
    else:
        raise invalid(f"{where} is a {type(x).__name__}; expected a numpy array or a torch tensor")
    return T.shape(x)


def shaped(x: Any, where: str, layout: str) -> Tuple[int, ...]:
    """array() of the rank `layout` names ("[q_heads, head_dim]")."""
    s = array(x, where)
    if len(s) != layout.count(",") + 1:
        raise invalid(f"{where} has shape {s}; expected {layout}")
    return s


def integer(v: Any, where: str, low: int = 0, high: int = UINT32_MAX) -> int:
    """An int (numpy integers too, bool not) in [low, high]."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise invalid(f"{where} is {v!r}; expected an integer")
    if not low <= int(v) <= high:
        raise invalid(f"{where} {int(v)} out of range [{low}, {high}]")
    return int(v)


def text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise invalid(f"{where} is {v!r}; expected a str")
    return v


def wire(name: Optional[str], x: Any, where: str) -> str:
    """The wire dtype `name`, or `x`'s own when None."""
    w = T.natural_wire(x) if name is None else name
    if w not in T.WIRE_DTYPES:
        raise invalid(f"{where} {w!r} is not one of {', '.join(T.WIRE_DTYPES)}")
    return w


def timeout(t: Any, where: str = "timeout") -> Optional[float]:
    """None (the client's default) or a number of seconds > 0."""
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0:
        raise invalid(f"{where} is {t!r}; expected a number of seconds > 0")
    return float(t)


def lease(t: Any, where: str) -> float:
    """A lease in seconds: a finite number > 0 (its upper bound is the
    server's to say)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < t < float("inf"):
        raise invalid(f"{where} is {t!r}; expected a number of seconds > 0")
    return float(t)


def destination(x: Any, where: str, bf16_bits: bool) -> Tuple[int, ...]:
    """The shape of a writable output array: floating-point, or for out
    numpy uint16 holding bf16 bit patterns."""
    if isinstance(x, np.ndarray):
        if not (x.dtype.kind == "f" or (bf16_bits and x.dtype == np.uint16)):
            raise invalid(f"{where} has dtype {x.dtype}; expected a floating-point array"
                          + (" or uint16 (bf16 bits)" if bf16_bits else ""))
        if not x.flags.writeable:
            raise invalid(f"{where} is read-only")
        return T.shape(x)
    if T.is_torch(x):
        if not x.is_floating_point():
            raise invalid(f"{where} has dtype {x.dtype}; expected a floating-point tensor")
        if x.requires_grad:
            raise invalid(f"{where} requires grad; pass a tensor that can be written in place")
        return T.shape(x)
    raise invalid(f"{where} is a {type(x).__name__}; expected a numpy array or a torch tensor")


def attend_items(batch: Sequence[Any], wire_dtype: Optional[str], stack: bool,
                 dests: Optional[Sequence[Optional[Tuple[Any, Any]]]] = None) -> None:
    """Every item of an Attend batch, whole, before the request is built.
    stack: the answers are stacked into [items, ...] (attend(), not
    attend_results()), so every query has items[0].query's shape. dests:
    per-item (out, lse) views, checked against their queries."""
    if len(batch) == 0:
        raise invalid("items is empty; send at least one item")
    first: Optional[Tuple[int, ...]] = None
    for i, it in enumerate(batch):
        where = f"items[{i}]"
        if not isinstance(it, AttendItem):
            raise invalid(f"{where} is a {type(it).__name__}; expected a driftkv.AttendItem")
        text(it.sequence_id, f"{where}.sequence_id")
        integer(it.layer, f"{where}.layer")
        qs = shaped(it.query, f"{where}.query", "[q_heads, head_dim]")
        wire(wire_dtype, it.query, "wire_dtype")
        if first is None:
            first = qs
        elif stack and qs != first:
            raise invalid(f"{where}.query has shape {qs}; expected {first} like items[0].query "
                          "(attend() stacks equal shapes; attend_results() takes any)")
        if (it.new_key is None) != (it.new_value is None):
            raise invalid(f"{where}: new_key and new_value go together (both or neither)")
        if it.new_key is not None:
            ks = shaped(it.new_key, f"{where}.new_key", f"[kv_heads, {qs[1]}]")
            vs = shaped(it.new_value, f"{where}.new_value", f"[kv_heads, {qs[1]}]")
            for name, s in (("new_key", ks), ("new_value", vs)):
                if s[1] != qs[1]:
                    raise invalid(f"{where}.{name} has shape {s}; expected [kv_heads, {qs[1]}]")
            if ks != vs:
                raise invalid(f"{where}.new_value has shape {vs}; expected {ks} like new_key")
            if it.new_token_index is not None:
                integer(it.new_token_index, f"{where}.new_token_index", high=UINT64_MAX)
        elif it.new_token_index is not None:
            raise invalid(f"{where}.new_token_index {it.new_token_index} is set but new_key/new_value are not")
        if it.softmax_scale is not None and (isinstance(it.softmax_scale, bool)
                                             or not isinstance(it.softmax_scale, numbers.Real)):
            raise invalid(f"{where}.softmax_scale is {it.softmax_scale!r}; expected a number")
        if dests is not None and dests[i] is not None:
            out, lse = dests[i]
            os_ = destination(out, f"{where}: out", bf16_bits=True)
            ls = destination(lse, f"{where}: lse", bf16_bits=False)
            if os_ != qs or ls != qs[:1]:
                raise invalid(f"{where}: out has shape {os_} and lse {ls}; expected {qs} and {qs[:1]}")


def layer_arrays(sequence_id: Any, layer: Any, keys: Any, values: Any, first_token: Any,
                 chunk_tokens: Any, wire_dtype: Optional[str]) -> Tuple[int, int, int]:
    """append()'s arguments, whole: the shape of keys (and values)."""
    text(sequence_id, "sequence_id")
    integer(layer, "layer")
    integer(first_token, "first_token", high=UINT64_MAX)
    integer(chunk_tokens, "chunk_tokens", low=1)
    ks = shaped(keys, "keys", "[tokens, kv_heads, head_dim]")
    vs = shaped(values, "values", "[tokens, kv_heads, head_dim]")
    if ks != vs:
        raise invalid(f"values has shape {vs}; expected {ks} like keys")
    wire(wire_dtype, keys, "wire_dtype")
    return ks


def chunk(c: Any, where: str) -> Tuple[int, int, int]:
    """One Chunk, whole: the shape of its keys (and values)."""
    if not isinstance(c, Chunk):
        raise invalid(f"{where} is a {type(c).__name__}; expected a driftkv.Chunk")
    text(c.sequence_id, f"{where}.sequence_id")
    integer(c.layer, f"{where}.layer")
    integer(c.first_token, f"{where}.first_token", high=UINT64_MAX)
    ks = shaped(c.keys, f"{where}.keys", "[tokens, kv_heads, head_dim]")
    vs = shaped(c.values, f"{where}.values", "[tokens, kv_heads, head_dim]")
    if ks != vs:
        raise invalid(f"{where}.values has shape {vs}; expected {ks} like keys")
    if ks[0] == 0:
        raise invalid(f"{where}.keys has shape {ks}; a chunk holds at least 1 token")
    wire(c.wire_dtype, c.keys, f"{where}.wire_dtype")
    if c.token_ids is not None:
        token_ids(c.token_ids, f"{where}.token_ids", ks[0])
    return ks


def token_ids(ids: Any, where: str, count: Optional[int] = None) -> List[int]:
    """Token ids as a list of uint32 ints, `count` of them when given."""
    try:
        out = [int(i) for i in ids]
    except (TypeError, ValueError):
        raise invalid(f"{where} is {type(ids).__name__}; expected a sequence of integers") from None
    if count is not None and len(out) != count:
        raise invalid(f"{where} has {len(out)} ids; the chunk has {count} tokens (one id per token)")
    for n, i in enumerate(out):
        if not 0 <= i <= 0xFFFFFFFF:
            raise invalid(f"{where}[{n}] is {i}; token ids are uint32")
    return out


def chunks(cs: Sequence[Any]) -> List[Any]:
    """Every chunk of a list or tuple, before the stream starts."""
    for n, c in enumerate(cs):
        chunk(c, f"chunks[{n}]")
    return list(cs)

