"""ctypes mirrors of the C structs of include/kvtier/*.h (the frozen 0.3 API).

Field names are the C names, so python/tests/test_abi.py can compare every
size and offset with what the C compiler says (python/tests/struct_layout.c).
At import, kvtier._loader checks the sizes the library itself reports.
"""

from __future__ import annotations

import ctypes
from typing import TypeVar
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)

# Limits and constants of the headers (values pinned by the 0.3 API).
KVT_MAX_RAW_LAYER = 256
KVT_CODEC_SPEC_TEXT_MAX = 1024
KVT_KEY_HEX_LEN = 32
KVT_CACHE_MAX_TIERS = 4
KVT_ARCH_MAX_LAYERS = 1024
KVT_ARCH_NAME_MAX = 48
KVT_LOG_ERROR, KVT_LOG_WARN, KVT_LOG_INFO, KVT_LOG_DEBUG = 0, 1, 2, 3

# kvt_allocator hooks and the log callback (kvtier/core.h).
AllocFn = CFUNCTYPE(c_void_p, c_void_p, c_size_t, c_size_t)
FreeFn = CFUNCTYPE(None, c_void_p, c_void_p)
LogFn = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class kvt_allocator(Structure):
    _fields_ = [
        ("alloc", AllocFn),
        ("free", FreeFn),
        ("opaque", c_void_p),
        ("reserved", c_uint64 * 2),
    ]


class kvt_ctx_config(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("allocator", kvt_allocator),
        ("log", LogFn),
        ("log_opaque", c_void_p),
        ("log_level", c_int),
        ("simd", c_int),
    ]


class kvt_codec_spec(Structure):
    _fields_ = [
        ("k_fmt", c_uint8),
        ("v_fmt", c_uint8),
        ("scale", c_uint8),
        ("k_axis", c_uint8),
        ("group", c_uint16),
        ("block", c_uint16),
        ("raw_layers", c_uint64 * (KVT_MAX_RAW_LAYER // 64)),
        ("reserved", c_uint64 * 2),
    ]


class kvt_kv_view(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("k", c_void_p),
        ("v", c_void_p),
        ("k_stride", c_int64 * 3),
        ("v_stride", c_int64 * 3),
        ("layers", c_uint32),
        ("tokens", c_uint32),
        ("heads", c_uint32),
        ("head_dim", c_uint32),
        ("dtype", c_int),
    ]


class kvt_key(Structure):
    _fields_ = [("bytes", c_uint8 * 16)]


class kvt_model_desc(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("model_id", c_char_p),
        ("dtype", c_int),
        ("layers", c_uint32),
        ("kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("tp_rank", c_uint32),
        ("tp_size", c_uint32),
    ]


class kvt_encode_params(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("spec", kvt_codec_spec),
        ("key", kvt_key),
        ("fingerprint", kvt_key),
        ("model_layers", c_uint32),
        ("layer_begin", c_uint32),
        ("token_begin", c_uint32),
        ("zstd_level", c_int),
    ]


class kvt_payload_info(Structure):
    _fields_ = [
        ("version_major", c_uint16),
        ("version_minor", c_uint16),
        ("flags", c_uint32),
        ("size", c_uint64),
        ("header_size", c_uint32),
        ("sections", c_uint32),
        ("key", kvt_key),
        ("fingerprint", kvt_key),
        ("spec", kvt_codec_spec),
        ("dtype", c_int),
        ("model_layers", c_uint32),
        ("layer_begin", c_uint32),
        ("layers", c_uint32),
        ("tokens", c_uint32),
        ("heads", c_uint32),
        ("head_dim", c_uint32),
        ("token_begin", c_uint32),
        ("reserved", c_uint64 * 4),
    ]


class kvt_section_info(Structure):
    _fields_ = [
        ("layer", c_uint32),
        ("is_value", c_int),
        ("fmt", c_int),
        ("comp", c_int),
        ("offset", c_uint64),
        ("stored_size", c_uint64),
        ("raw_size", c_uint64),
        ("checksum", c_uint64),
        ("reserved", c_uint64 * 2),
    ]


class kvt_decode_params(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("expect_key", POINTER(kvt_key)),
        ("expect_fingerprint", POINTER(kvt_key)),
        ("layer_first", c_uint32),
        ("layer_count", c_uint32),
    ]


class kvt_cache_config(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("tiers", c_char_p),
        ("fingerprint", POINTER(kvt_key)),
        ("chunk_tokens", c_uint32),
        ("flags", c_uint32),
        ("headroom_pct", c_uint32),
        ("links", c_char_p),
        ("tier_handles", POINTER(c_void_p)),
        ("n_tier_handles", c_uint32),
    ]


class kvt_cache_get_req(Structure):
    _fields_ = [
        ("key", kvt_key),
        ("buf", c_void_p),
        ("cap", c_uint64),
        ("len", c_uint64),
        ("result", c_int32),
        ("tier", c_int32),
        ("reserved", c_uint64 * 2),
    ]


class kvt_cache_loan(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("len", c_uint64),
        ("tier", c_int32),
        ("internal", c_void_p * 3),
        ("reserved", c_uint64 * 2),
    ]


class kvt_cache_reservation(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("len", c_uint64),
        ("key", kvt_key),
        ("tier", c_int32),
        ("internal", c_void_p * 3),
        ("reserved", c_uint64 * 2),
    ]


class kvt_cache_stats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [
        (name, c_uint64)
        for name in (
            "capacity", "used", "items", "hits", "misses", "puts", "bytes_in", "bytes_out",
            "demotions", "promotions", "evictions", "errors", "gets", "refused", "duplicates",
            "lookups", "lookup_hit_tokens", "pinned",
        )
    ]


class kvt_model_arch(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char * KVT_ARCH_NAME_MAX),
        ("layers", c_uint32),
        ("kv_heads", c_uint32),
        ("k_dim", c_uint32),
        ("v_dim", c_uint32),
        ("window", c_uint32),
        ("window_layers", c_uint64 * (KVT_ARCH_MAX_LAYERS // 64)),
        ("q_heads", c_uint32),
        ("qk_dim", c_uint32),
        ("pv_dim", c_uint32),
        ("max_context", c_uint32),
        ("weight_bits", c_uint32),
        ("mla", c_uint32),
        ("params", c_double),
        ("active_params", c_double),
    ]


class kvt_cache_plan(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("cached_tokens", c_size_t),
        ("tier_bytes", c_uint64 * KVT_CACHE_MAX_TIERS),
        ("link_GBps", c_double * KVT_CACHE_MAX_TIERS),
        ("restore_s", c_double),
        ("recompute_s", c_double),
        ("restore_pays", c_int),
    ]


class kvt_model_kv_rate(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("full_bytes", c_double),
        ("window_bytes", c_double),
        ("window", c_uint32),
        ("chunk_tokens", c_uint32),
        ("elements", c_double),
    ]


class kvt_model_projection_config(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("batch", c_double),
        ("context", c_double),
        ("step_ms", c_double),
        ("spec_k", c_double),
    ]


class kvt_model_projection(Structure):
    _fields_ = [
        ("seq_bytes", c_double),
        ("bytes_per_token", c_double),
        ("step_bytes", c_double),
        ("required_Bps", c_double),
        ("reserved", c_uint64 * 4),
    ]


class kvt_model_link(Structure):
    _fields_ = [("name", c_char_p), ("what", c_char_p), ("GBps", c_double)]


# Every struct mirrored here, by its C name (python/tests/test_abi.py walks this).
MIRRORED: dict[str, type[Structure]] = {
    cls.__name__: cls
    for cls in (
        kvt_allocator, kvt_ctx_config, kvt_codec_spec, kvt_kv_view, kvt_key, kvt_model_desc,
        kvt_encode_params, kvt_payload_info, kvt_section_info, kvt_decode_params,
        kvt_cache_config, kvt_cache_get_req, kvt_cache_loan, kvt_cache_reservation,
        kvt_cache_stats, kvt_cache_plan, kvt_model_arch,
        kvt_model_kv_rate, kvt_model_projection_config, kvt_model_projection, kvt_model_link,
    )
}


_S = TypeVar("_S", bound=Structure)


def init(cls: type[_S]) -> _S:
    """A zeroed struct with struct_size set. The caller sets the non-zero
    defaults of the matching KVT_*_INIT macro itself."""
    s = cls()
    if "struct_size" in (f[0] for f in cls._fields_):
        setattr(s, "struct_size", ctypes.sizeof(cls))
    return s
