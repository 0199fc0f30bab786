"""Codec specs, and encode/decode of K/V arrays to and from payloads
(kvtier/codec.h, kvtier/payload.h)."""

from __future__ import annotations

import ctypes
import enum
from typing import Any, FrozenSet, Optional, Union

import numpy as np

from . import _structs as S
from ._buffers import DTYPE_BF16, Buffer, Tensor, kv_pair, read_buffer, tensor, write_buffer
from ._context import ctx
from ._loader import lib
from .errors import Error, ErrorCode
from .keys import Key

# The presets of kvtier/codec.h, in its order (test_codec.py checks this
# against the list kvt_codec_parse names when it refuses an unknown one).
PRESETS: tuple[str, ...] = ("raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4")


class DType(enum.IntEnum):
    """enum kvt_dtype: the engine cache's element type."""

    BF16 = 1
    F16 = 2


class Fmt(enum.IntEnum):
    """enum kvt_fmt: how keys or values are stored."""

    N16 = 0
    E4M3 = 1
    I8 = 2
    I4 = 3


class Scale(enum.IntEnum):
    """enum kvt_scale: granularity of e4m3 and i8 scales."""

    TOKEN = 0
    BLOCK = 1
    LAYER = 2


class Axis(enum.IntEnum):
    """enum kvt_axis: the axis i4 key groups run along."""

    DIM = 0
    TOKEN = 1


class CodecSpec:
    """A parsed codec spec ("k16v8", "int4,kgroup=dim", "k=n16,v=i4,group=64").

    Equal specs compare equal and have the same canonical text (str(spec)).
    Immutable.
    """

    __slots__ = ("_c",)
    _c: S.kvt_codec_spec

    def __init__(self, text: Union[str, "CodecSpec"] = "raw") -> None:
        if isinstance(text, CodecSpec):
            self._c = S.kvt_codec_spec.from_buffer_copy(text._c)
            return
        c = S.kvt_codec_spec()
        ctx().call(lib.kvt_codec_parse, str(text).encode(), ctypes.byref(c))
        self._c = c

    @classmethod
    def _from_struct(cls, c: S.kvt_codec_spec) -> "CodecSpec":
        self = cls.__new__(cls)
        self._c = S.kvt_codec_spec.from_buffer_copy(c)
        return self

    @property
    def struct(self) -> S.kvt_codec_spec:
        """The C struct (a copy)."""
        return S.kvt_codec_spec.from_buffer_copy(self._c)

    @property
    def k_fmt(self) -> Fmt:
        return Fmt(self._c.k_fmt)

    @property
    def v_fmt(self) -> Fmt:
        return Fmt(self._c.v_fmt)

    @property
    def scale(self) -> Scale:
        return Scale(self._c.scale)

    @property
    def k_axis(self) -> Axis:
        return Axis(self._c.k_axis)

    @property
    def group(self) -> int:
        return int(self._c.group)

    @property
    def block(self) -> int:
        return int(self._c.block)

    @property
    def raw_layers(self) -> FrozenSet[int]:
        """Absolute layers kept n16 by raw= overrides."""
        return frozenset(i for i in range(S.KVT_MAX_RAW_LAYER)
                         if self._c.raw_layers[i // 64] >> (i % 64) & 1)

    def layer_fmt(self, layer: int, value: bool = False) -> Fmt:
        """The format of keys (or values) of an absolute layer, after raw=."""
        return Fmt(lib.kvt_codec_layer_fmt(ctypes.byref(self._c), layer, int(value)))

    def __str__(self) -> str:
        buf = ctypes.create_string_buffer(S.KVT_CODEC_SPEC_TEXT_MAX)
        rc = lib.kvt_codec_format(ctypes.byref(self._c), buf, len(buf))
        if rc:
            raise Error(rc, detail="kvt_codec_format")
        return buf.value.decode()

    def __repr__(self) -> str:
        return f"CodecSpec({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = CodecSpec(other)
        return isinstance(other, CodecSpec) and bytes(self._c) == bytes(other._c)

    def __hash__(self) -> int:
        return hash(bytes(self._c))


Codec = Union[str, CodecSpec]


def codec_spec(codec: Codec) -> CodecSpec:
    return codec if isinstance(codec, CodecSpec) else CodecSpec(codec)


def has_feature(name: str) -> bool:
    """Whether an optional part was built into the library: "zstd", "avx2", "cuda"."""
    return bool(lib.kvt_has_feature(name.encode()))


def encode_bound(codec: Codec, layers: int, tokens: int, heads: int, head_dim: int, *,
                 layer_begin: int = 0) -> int:
    """Bytes encode() may write for this shape: exact without zstd, a bound with it."""
    spec = codec_spec(codec)
    out = ctypes.c_uint64()
    ctx().call(lib.kvt_encode_bound, ctypes.byref(spec._c), layer_begin, layers, tokens, heads,
               head_dim, ctypes.byref(out))
    return int(out.value)


def _view(tk: Tensor, tv: Tensor, dtype: int) -> S.kvt_kv_view:
    view = S.init(S.kvt_kv_view)
    view.k, view.v = tk.ptr, tv.ptr
    for i in range(3):
        view.k_stride[i], view.v_stride[i] = tk.strides[i], tv.strides[i]
    view.layers, view.tokens, view.heads, view.head_dim = tk.shape
    view.dtype = dtype
    return view


def _encode_params(spec: CodecSpec, key: Optional[Key], fingerprint: Optional[Key],
                   layer_begin: int, model_layers: int, token_begin: int,
                   zstd_level: int) -> S.kvt_encode_params:
    p = S.init(S.kvt_encode_params)
    p.spec = spec.struct
    if key is not None:
        p.key = Key(key).struct
    if fingerprint is not None:
        p.fingerprint = Key(fingerprint).struct
    p.model_layers, p.layer_begin, p.token_begin = model_layers, layer_begin, token_begin
    p.zstd_level = zstd_level
    return p


def encode_into(out: Buffer, k: Any, v: Any, codec: Codec = "k16v8", *,
                dtype: Any = None, key: Optional[Key] = None,
                fingerprint: Optional[Key] = None, layer_begin: int = 0,
                model_layers: int = 0, token_begin: int = 0, zstd_level: int = 0) -> int:
    """Encodes K and V into the writable buffer out; returns the payload's
    length. Arguments as encode(). Raises Error(KVT_ENOBUFS) when out is
    smaller than the payload (encode_bound() is always enough)."""
    tk, tv, code = kv_pair(k, v, dtype)
    view = _view(tk, tv, code)
    p = _encode_params(codec_spec(codec), key, fingerprint, layer_begin, model_layers,
                       token_begin, zstd_level)
    addr, cap, keep = write_buffer(out)
    n = ctypes.c_size_t()
    ctx().call(lib.kvt_encode, ctypes.byref(p), ctypes.byref(view), addr, cap, ctypes.byref(n))
    del keep
    return int(n.value)


def encode(k: Any, v: Any, codec: Codec = "k16v8", *, dtype: Any = None,
           key: Optional[Key] = None, fingerprint: Optional[Key] = None,
           layer_begin: int = 0, model_layers: int = 0, token_begin: int = 0,
           zstd_level: int = 0) -> bytes:
    """Encodes one chunk of K and V into a payload.

    k, v: arrays of shape [tokens, heads, head_dim] (one layer) or
        [layers, tokens, heads, head_dim], read in place through their
        strides (the head_dim elements of a head must be contiguous): numpy
        float16 or ml_dtypes bfloat16 arrays, numpy 16-bit integer arrays
        holding the bits (then name dtype), torch CPU tensors.
    codec: a preset (PRESETS) or a spec string, or a CodecSpec.
    dtype: "bf16" or "fp16"; needed only when the arrays hold integers.
    key, fingerprint: the chunk key and model fingerprint the payload carries
        (kvtier.chunk_key, kvtier.fingerprint); None: all zeros.
    layer_begin: absolute index of the arrays' first layer.
    model_layers: layers of the whole model (0: the arrays' layer count).
    token_begin: position of the chunk's first token in its sequence.
    zstd_level: 0 (off) or 1..19, the lossless stage where it saves >= 3%.

    Raises Error: KVT_ESPEC, KVT_ESHAPE, KVT_ETOOBIG, KVT_ENONFINITE (with
    the layer, token and head), KVT_ERANGE, KVT_ENOTSUP (no zstd), -ENOMEM.
    """
    tk, tv, code = kv_pair(k, v, dtype)
    spec = codec_spec(codec)
    layers, tokens, heads, head_dim = tk.shape
    cap = encode_bound(spec, layers, tokens, heads, head_dim, layer_begin=layer_begin)
    buf = bytearray(cap)
    n = encode_into(buf, tk, tv, spec, dtype=code, key=key, fingerprint=fingerprint,
                    layer_begin=layer_begin, model_layers=model_layers,
                    token_begin=token_begin, zstd_level=zstd_level)
    return bytes(memoryview(buf)[:n])


def _decode_params(layer_first: int, layer_count: int, expect_key: Optional[Key],
                   expect_fingerprint: Optional[Key]) -> tuple[S.kvt_decode_params, list[Any]]:
    p = S.init(S.kvt_decode_params)
    p.layer_first, p.layer_count = layer_first, layer_count
    keep: list[Any] = []
    if expect_key is not None:
        kk = Key(expect_key).struct
        keep.append(kk)
        p.expect_key = ctypes.pointer(kk)
    if expect_fingerprint is not None:
        fk = Key(expect_fingerprint).struct
        keep.append(fk)
        p.expect_fingerprint = ctypes.pointer(fk)
    return p, keep


def decode(payload: Buffer, k: Any = None, v: Any = None, *, layer_first: int = 0,
           layer_count: int = 0, expect_key: Optional[Key] = None,
           expect_fingerprint: Optional[Key] = None) -> tuple[Any, Any]:
    """Verifies a payload and decodes its K and V; returns (k, v).

    Without k and v, new numpy arrays [layers, tokens, heads, head_dim] are
    returned: float16 for an fp16 payload, uint16 holding the bf16 bits for a
    bf16 one (view them with ml_dtypes.bfloat16, or shift into float32). With
    k and v (writable arrays as encode() takes, of the payload's dtype or
    16-bit integers), they are written in place through their strides and
    returned.

    layer_first, layer_count: the layers to decode, relative to the payload's
        first layer (count 0: all from layer_first on).
    expect_key, expect_fingerprint: refuse a payload of another chunk or
        model (KVT_EFOREIGN).

    Raises Error: KVT_EFORMAT, KVT_EVERSION, KVT_ETRUNC, KVT_ECORRUPT,
    KVT_ECHECKSUM (a section's checksum; nothing of it is written),
    KVT_EFOREIGN, KVT_ESHAPE (k/v do not match the payload).
    """
    from .payload import inspect

    info = inspect(payload)
    if (k is None) != (v is None):
        raise ValueError("kvtier: give both k and v, or neither")
    if k is None:
        count = layer_count or max(info.layers - layer_first, 0)
        shape = (count, info.tokens, info.heads, info.head_dim)
        np_dtype = np.uint16 if info.dtype == "bf16" else np.float16
        k, v = np.empty(shape, np_dtype), np.empty(shape, np_dtype)
    tk, tv = tensor(k, "K"), tensor(v, "V")
    for t, name in ((tk, "K"), (tv, "V")):
        if not t.writable:
            raise ValueError(f"kvtier: {name} is read-only")
    if tk.shape != tv.shape:
        raise Error(ErrorCode.ESHAPE, detail=f"K has shape {tk.shape}, V has {tv.shape}")
    payload_dtype = DTYPE_BF16 if info.dtype == "bf16" else 2
    codes = {t.dtype for t in (tk, tv)} - {None}
    if len(codes) > 1:
        raise Error(ErrorCode.ESHAPE, detail="K and V have different dtypes")
    code: int = codes.pop() if codes else payload_dtype  # type: ignore[assignment]
    view = _view(tk, tv, code)
    p, keep = _decode_params(layer_first, layer_count, expect_key, expect_fingerprint)
    addr, n, pkeep = read_buffer(payload)
    ctx().call(lib.kvt_decode, addr, n, ctypes.byref(p), ctypes.byref(view))
    del keep, pkeep
    return k, v
