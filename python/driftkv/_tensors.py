"""Arrays to and from the wire: numpy arrays, and torch tensors when torch
is importable (never imported here: a tensor's presence means it is).

Wire tensors are little-endian C-order bytes of bf16, fp16 or f32 (the
proto's DType). The wire dtype of a tensor is the caller's choice or,
by default, its own: torch bfloat16 -> bf16, float16 (numpy or torch) ->
fp16, anything else -> f32. The conversion to bf16 rounds to nearest even,
as wire/half.h does (the server stores bf16 either way).
"""
import sys
from typing import Any, Tuple

import numpy as np

from driftkv._errors import invalid
from driftkv._proto import pb

Array = Any  # np.ndarray or torch.Tensor

WIRE_DTYPES = {"bf16": pb.DTYPE_BF16, "fp16": pb.DTYPE_FP16, "f32": pb.DTYPE_F32}
_BY_ENUM = {v: k for k, v in WIRE_DTYPES.items()}


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def shape(x: Array) -> Tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def natural_wire(x: Array) -> str:
    """The wire dtype a tensor travels as by default."""
    if is_torch(x):
        torch = sys.modules["torch"]
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(x.dtype, "f32")
    return "fp16" if np.asarray(x).dtype == np.float16 else "f32"


def check_wire(wire: str) -> int:
    if wire not in WIRE_DTYPES:
        raise invalid(f"wire_dtype {wire!r} is not one of {', '.join(WIRE_DTYPES)}")
    return WIRE_DTYPES[wire]


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded)
    return rounded.astype("<u2")


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << np.uint32(16)).view("<f4")


def to_wire(x: Array, wire: str) -> bytes:
    """The tensor's bytes in `wire` dtype (C order)."""
    if is_torch(x):
        torch = sys.modules["torch"]
        t = x.detach()
        if wire == "bf16":
            return t.to(torch.bfloat16).contiguous().cpu().view(torch.int16).numpy().tobytes()
        target = torch.float16 if wire == "fp16" else torch.float32
        return t.to(target).contiguous().cpu().numpy().tobytes()
    a = np.asarray(x)
    if wire == "bf16":
        return f32_to_bf16_bits(a.astype(np.float32, copy=False)).tobytes()
    return np.ascontiguousarray(a, dtype="<f2" if wire == "fp16" else "<f4").tobytes()


def from_wire(data: bytes, dtype_enum: int, shape_: Tuple[int, ...]) -> np.ndarray:
    """Wire bytes -> float32 array of `shape_`."""
    wire = _BY_ENUM.get(dtype_enum, "f32")
    if wire == "f32":
        a = np.frombuffer(data, dtype="<f4").astype(np.float32)
    elif wire == "fp16":
        a = np.frombuffer(data, dtype="<f2").astype(np.float32)
    else:
        a = bf16_bits_to_f32(np.frombuffer(data, dtype="<u2"))
    return a.reshape(shape_)


def like(reference: Array, a: np.ndarray) -> Array:
    """`a` as the caller's kind of array: a torch tensor on the reference's
    device when the reference is one, else the numpy array."""
    if is_torch(reference):
        torch = sys.modules["torch"]
        return torch.from_numpy(a).to(reference.device)
    return a


