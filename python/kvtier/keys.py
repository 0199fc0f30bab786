"""Chunk keys and model fingerprints (kvtier/key.h): 128-bit, the same in
every process and on every run for equal prefixes of the same model."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional, Union

from . import _structs as S
from ._buffers import TokenIds, dtype_code, token_array, u32_ptr
from ._loader import lib
from .errors import Error

if TYPE_CHECKING:
    from .codec import Codec


class Key:
    """A 128-bit chunk key or fingerprint. Immutable and hashable.

    Key(b"16 bytes..."), Key("32 hex digits"), Key(other_key). bytes(key)
    gives the 16 bytes, str(key) and key.hex() the lower-case hex.
    """

    __slots__ = ("_b",)

    def __init__(self, value: Union["Key", bytes, bytearray, memoryview, str]) -> None:
        if isinstance(value, Key):
            self._b: bytes = value._b
        elif isinstance(value, str):
            c = S.kvt_key()
            rc = lib.kvt_key_from_hex(value.encode(), ctypes.byref(c))
            if rc:
                raise Error(rc, detail=f"not 32 hex digits: {value!r}")
            self._b = bytes(c)
        else:
            b = bytes(value)
            if len(b) != 16:
                raise ValueError(f"kvtier: a key is 16 bytes, got {len(b)}")
            self._b = b

    @classmethod
    def _from_struct(cls, c: S.kvt_key) -> "Key":
        return cls(bytes(c))

    @property
    def struct(self) -> S.kvt_key:
        """The C kvt_key (a copy)."""
        return S.kvt_key.from_buffer_copy(self._b)

    def hex(self) -> str:
        """kvt_key_hex(): 32 lower-case hex digits."""
        buf = ctypes.create_string_buffer(S.KVT_KEY_HEX_LEN + 1)
        lib.kvt_key_hex(ctypes.byref(self.struct), buf)
        return buf.value.decode()

    def __bytes__(self) -> bytes:
        return self._b

    def __str__(self) -> str:
        return self.hex()

    def __repr__(self) -> str:
        return f"Key({self.hex()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other._b == self._b

    def __hash__(self) -> int:
        return hash(self._b)


KeyLike = Union[Key, bytes, str]


@dataclass(frozen=True)
class ModelDesc:
    """What the fingerprint identifies (kvt_model_desc): the model, the engine
    cache's dtype, the shape this rank holds, and the tensor-parallel rank."""

    model_id: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"
    tp_rank: int = 0
    tp_size: int = 1

    @property
    def struct(self) -> S.kvt_model_desc:
        d = S.init(S.kvt_model_desc)
        d.model_id = self.model_id.encode()
        d.dtype = dtype_code(self.dtype)
        d.layers, d.kv_heads, d.head_dim = self.layers, self.kv_heads, self.head_dim
        d.tp_rank, d.tp_size = self.tp_rank, self.tp_size
        return d


def fingerprint(model: ModelDesc, codec: "Codec") -> Key:
    """kvt_fingerprint(): a Key naming (model, dtype, shape, rank, codec).
    Raises Error(-EINVAL) for an empty model id, zero sizes or
    tp_rank >= tp_size, or Error(KVT_ESPEC)."""
    from .codec import codec_spec

    spec = codec_spec(codec)
    out = S.kvt_key()
    desc = model.struct
    rc = lib.kvt_fingerprint(ctypes.byref(desc), ctypes.byref(spec._c), ctypes.byref(out))
    if rc:
        raise Error(rc, detail=f"kvt_fingerprint of {model}")
    return Key._from_struct(out)


def _key_ptr(key: Optional[KeyLike], keep: List[Any]) -> Any:
    if key is None:
        return None
    c = Key(key).struct
    keep.append(c)
    return ctypes.byref(c)


def chunk_key(fingerprint: KeyLike, tokens: TokenIds, prev: Optional[KeyLike] = None) -> Key:
    """The key of one chunk: fingerprint, the previous chunk's key (None for
    a first chunk) and the chunk's token ids (uint32)."""
    ids = token_array(tokens)
    keep: List[Any] = []
    out = S.kvt_key()
    rc = lib.kvt_chunk_key(_key_ptr(fingerprint, keep), _key_ptr(prev, keep), u32_ptr(ids),
                           ids.size, ctypes.byref(out))
    if rc:
        raise Error(rc, detail=f"kvt_chunk_key over {ids.size} tokens")
    return Key._from_struct(out)


def chunk_keys(fingerprint: KeyLike, tokens: TokenIds, chunk_tokens: int) -> List[Key]:
    """Keys of every full chunk of chunk_tokens tokens, chained from the
    first (a trailing partial chunk gets none)."""
    ids = token_array(tokens)
    n = ids.size // chunk_tokens if chunk_tokens > 0 else 0
    out = (S.kvt_key * max(n, 1))()
    got = ctypes.c_size_t()
    keep: List[Any] = []
    rc = lib.kvt_chunk_keys(_key_ptr(fingerprint, keep), u32_ptr(ids), ids.size, chunk_tokens,
                            out, n, ctypes.byref(got))
    if rc:
        raise Error(rc, detail=f"kvt_chunk_keys over {ids.size} tokens, chunks of {chunk_tokens}")
    return [Key._from_struct(out[i]) for i in range(got.value)]
