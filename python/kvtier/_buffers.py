"""Pointers into the caller's memory, without copies: payload bytes (any
buffer), token ids (uint32), and K/V arrays (numpy, torch CPU tensors, or any
object with __array_interface__) described by shape and strides."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np

from .errors import Error, ErrorCode

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]  # or any C-contiguous buffer
TokenIds = Union[Sequence[int], np.ndarray]

DTYPE_BF16, DTYPE_F16 = 1, 2
_DTYPE_NAMES = {"bf16": DTYPE_BF16, "bfloat16": DTYPE_BF16, "fp16": DTYPE_F16,
                "f16": DTYPE_F16, "float16": DTYPE_F16, "half": DTYPE_F16}


def dtype_code(dtype: Any) -> int:
    """1 (bf16) or 2 (fp16) from a name, a DType, or a numpy/torch dtype."""
    if isinstance(dtype, int):
        if dtype in (DTYPE_BF16, DTYPE_F16):
            return int(dtype)
    else:
        name = str(dtype).lower().replace("torch.", "")
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise ValueError(f"kvtier: dtype {dtype!r}: expected bf16 or fp16")


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr")


def _as_numpy_bytes(obj: Any) -> np.ndarray:
    if _is_torch(obj):
        if obj.device.type != "cpu":
            raise ValueError(f"kvtier: a payload must be in host memory, not on {obj.device}")
        obj = obj.detach().numpy()
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("kvtier: a payload buffer must be C-contiguous")
        return obj.reshape(-1).view(np.uint8)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"kvtier: expected a bytes-like payload, got {type(obj).__name__}") from None
    if not mv.c_contiguous:
        raise ValueError("kvtier: a payload buffer must be C-contiguous")
    return np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, np.uint8)


def read_buffer(obj: Any) -> tuple[int, int, Any]:
    """(address, length, keepalive) of a read-only view of obj's bytes."""
    if isinstance(obj, bytes):
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, len(obj), obj
    a = _as_numpy_bytes(obj)
    return a.ctypes.data, a.nbytes, a


def write_buffer(obj: Any) -> tuple[int, int, Any]:
    """(address, capacity, keepalive) of a writable buffer."""
    if isinstance(obj, bytes):
        raise TypeError("kvtier: bytes are immutable; pass a bytearray or a numpy uint8 array")
    a = _as_numpy_bytes(obj)
    if not a.flags.writeable:
        raise ValueError("kvtier: the output buffer is read-only")
    return a.ctypes.data, a.nbytes, a


def token_array(tokens: TokenIds) -> np.ndarray:
    """Token ids as a contiguous uint32 array (no copy when already one)."""
    a = np.asarray(tokens)
    if a.dtype == np.uint32 and a.ndim == 1 and a.flags.c_contiguous:
        return a
    if a.ndim != 1:
        raise ValueError(f"kvtier: token ids must be one-dimensional, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"kvtier: token ids must be integers, got {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
        raise ValueError("kvtier: token ids must fit in 32 bits unsigned")
    return np.ascontiguousarray(a, dtype=np.uint32)


def u32_ptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))


@dataclass
class Tensor:
    """One K or V operand: [layers, tokens, heads, head_dim] in elements."""

    ptr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int]  # layer, token, head; elements
    dtype: int | None  # None: 16-bit integers, dtype to be named
    writable: bool
    keep: Any


def _shape_error(what: str, detail: str) -> Error:
    return Error(ErrorCode.ESHAPE, detail=f"{what}: {detail}")


def _finish(what: str, ptr: int, shape: Sequence[int], strides: Sequence[int], dtype: int | None,
            writable: bool, keep: Any) -> Tensor:
    if len(shape) == 3:  # [tokens, heads, head_dim]: one layer
        shape, strides = (1, *shape), (0, *strides)
    if len(shape) != 4:
        raise _shape_error(what, f"expected [tokens, heads, head_dim] or "
                                 f"[layers, tokens, heads, head_dim], got shape {tuple(shape)}")
    if shape[3] > 1 and strides[3] != 1:
        raise _shape_error(what, f"the head_dim elements of a head must be contiguous "
                                 f"(stride 1), got stride {strides[3]}")
    s, st = [int(x) for x in shape], [int(x) for x in strides]
    return Tensor(ptr, (s[0], s[1], s[2], s[3]), (st[0], st[1], st[2]), dtype, writable, keep)


def _numpy_dtype(dt: np.dtype) -> int | None | str:
    if dt == np.float16:
        return DTYPE_F16
    if dt.name == "bfloat16":  # ml_dtypes
        return DTYPE_BF16
    if dt.itemsize == 2 and dt.kind in "iu":
        return None
    return f"{dt}"


def tensor(obj: Any, what: str) -> Tensor:
    """Describes a K or V array without copying it (a Tensor already
    describing one, from raw pointers, is returned as it is)."""
    if isinstance(obj, Tensor):
        return obj
    if _is_torch(obj):
        if obj.device.type != "cpu":
            raise ValueError(f"kvtier: {what} is on {obj.device}; the CPU codecs read host memory "
                             "(GPU tensors go through the GPU handle)")
        name = str(obj.dtype).replace("torch.", "")
        dt: int | None | str = {"bfloat16": DTYPE_BF16, "float16": DTYPE_F16}.get(name)
        if dt is None and name not in ("int16", "uint16"):
            dt = name
        if isinstance(dt, str):
            raise _shape_error(what, f"dtype {dt}: expected bfloat16 or float16")
        return _finish(what, obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), dt,
                       True, obj)
    if isinstance(obj, np.ndarray):
        dt = _numpy_dtype(obj.dtype)
        if isinstance(dt, str):
            raise _shape_error(what, f"dtype {dt}: expected float16, bfloat16 or 16-bit "
                                     "integers holding the bits")
        strides = [s // 2 for s in obj.strides]
        if any(s % 2 for s in obj.strides):
            raise _shape_error(what, f"strides {obj.strides} are not whole elements")
        return _finish(what, obj.ctypes.data, obj.shape, strides, dt, obj.flags.writeable, obj)
    ai = getattr(obj, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"kvtier: {what} must be a numpy array, a torch CPU tensor or an object "
                        f"with __array_interface__, not {type(obj).__name__}")
    return tensor(np.asarray(obj), what)  # np.asarray shares memory through the interface


def kv_pair(k: Any, v: Any, dtype: Any) -> tuple[Tensor, Tensor, int]:
    """K and V described, with their common dtype code."""
    tk, tv = tensor(k, "K"), tensor(v, "V")
    if tk.shape != tv.shape:
        raise _shape_error("K/V", f"K has shape {tk.shape}, V has {tv.shape}")
    named = dtype_code(dtype) if dtype is not None else None
    codes = {t.dtype for t in (tk, tv)}
    if len(codes - {None}) > 1:
        raise _shape_error("K/V", "K and V have different dtypes")
    have = next(iter(codes - {None}), None)
    if named is not None and have is not None and named != have:
        raise _shape_error("K/V", f"dtype={dtype!r} but the arrays are "
                                  f"{'bf16' if have == DTYPE_BF16 else 'fp16'}")
    code = named if named is not None else have
    if code is None:
        raise ValueError("kvtier: K and V hold 16-bit integers: say what they are with "
                         "dtype='bf16' or dtype='fp16'")
    return tk, tv, code
