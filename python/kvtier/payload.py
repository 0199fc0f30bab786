"""What a payload's header says, and its integrity (kvtier/payload.h)."""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import List, Tuple

from . import _structs as S
from ._buffers import Buffer, read_buffer
from ._context import ctx
from ._loader import lib
from .codec import CodecSpec, Fmt
from .keys import Key

FLAG_LOSSLESS = 1  # KVT_PAYLOAD_FLAG_LOSSLESS: some section uses the zstd stage


class Comp(enum.IntEnum):
    """enum kvt_comp: a section's lossless stage."""

    NONE = 0
    ZSTD = 1
    ZSTD_SHUFFLE16 = 2


@dataclass(frozen=True)
class PayloadInfo:
    """kvt_payload_info: the header's fields."""

    version: Tuple[int, int]  # (major, minor) of the payload format
    flags: int
    size: int  # whole payload, bytes
    header_size: int
    sections: int
    key: Key
    fingerprint: Key
    codec: CodecSpec
    dtype: str  # "bf16" or "fp16"
    model_layers: int
    layer_begin: int
    layers: int
    tokens: int
    heads: int
    head_dim: int
    token_begin: int

    @property
    def lossless(self) -> bool:
        return bool(self.flags & FLAG_LOSSLESS)


@dataclass(frozen=True)
class SectionInfo:
    """kvt_section_info: one entry of the section table."""

    layer: int  # absolute
    is_value: bool
    fmt: Fmt
    comp: Comp
    offset: int
    stored_size: int
    raw_size: int
    checksum: int  # the section checksum: over 4 KiB pieces (format 2), XXH3-64 (format 1)


def _info(c: S.kvt_payload_info) -> PayloadInfo:
    return PayloadInfo(
        version=(int(c.version_major), int(c.version_minor)), flags=int(c.flags),
        size=int(c.size), header_size=int(c.header_size), sections=int(c.sections),
        key=Key._from_struct(c.key), fingerprint=Key._from_struct(c.fingerprint),
        codec=CodecSpec._from_struct(c.spec), dtype=lib.kvt_dtype_name(c.dtype).decode(),
        model_layers=int(c.model_layers), layer_begin=int(c.layer_begin), layers=int(c.layers),
        tokens=int(c.tokens), heads=int(c.heads), head_dim=int(c.head_dim),
        token_begin=int(c.token_begin))


def inspect(payload: Buffer) -> PayloadInfo:
    """kvt_payload_parse(): validates the header and section table (not the
    section bodies) and returns the header. Raises Error: KVT_EFORMAT,
    KVT_EVERSION, KVT_ETRUNC, KVT_ECORRUPT, KVT_ECHECKSUM (header), KVT_ETOOBIG."""
    addr, n, keep = read_buffer(payload)
    c = S.kvt_payload_info()
    ctx().call(lib.kvt_payload_parse, addr, n, ctypes.byref(c))
    del keep
    return _info(c)


def verify(payload: Buffer) -> PayloadInfo:
    """kvt_payload_verify(): inspect() plus every section's checksum and the
    padding between sections. Raises Error as inspect(), KVT_ECHECKSUM naming
    the section for a damaged body."""
    addr, n, keep = read_buffer(payload)
    c = S.kvt_payload_info()
    ctx().call(lib.kvt_payload_verify, addr, n, ctypes.byref(c))
    del keep
    return _info(c)


def sections(payload: Buffer) -> List[SectionInfo]:
    """The section table of a payload that inspect() accepts."""
    addr, n, keep = read_buffer(payload)
    c = ctx()
    info = S.kvt_payload_info()
    c.call(lib.kvt_payload_parse, addr, n, ctypes.byref(info))
    out = []
    for i in range(info.sections):
        s = S.kvt_section_info()
        c.call(lib.kvt_payload_section, addr, n, i, ctypes.byref(s))
        out.append(SectionInfo(layer=int(s.layer), is_value=bool(s.is_value), fmt=Fmt(s.fmt),
                               comp=Comp(s.comp), offset=int(s.offset),
                               stored_size=int(s.stored_size), raw_size=int(s.raw_size),
                               checksum=int(s.checksum)))
    del keep
    return out
