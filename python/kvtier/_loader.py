"""Finds and loads libkvtier, declares the C functions, and checks at import
that the library is the one this package mirrors.

Where the library comes from, first match wins:
  1. $KVTIER_LIBRARY, a path (an error if it does not load: no fallback);
  2. the copy bundled in the package, kvtier/_lib/libkvtier.so.<major>.<minor>
     (put there by `./bootstrap.sh python`, see README.md);
  3. the system loader: libkvtier.so.<major>.<minor> (LD_LIBRARY_PATH, ld.so.cache).

Checks at import: the library's major.minor equals the package's (the soname
changes with every 0.y), and every struct size the library reports at run
time equals the ctypes mirror's (struct_size fields it fills in, and the extent
of output structs it writes whole). python/tests/test_abi.py checks every
size and offset against the C compiler.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_int,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any

from . import _structs as S

VERSION = (0, 3, 3)  # the package's version; major.minor must match the library's
SONAME = f"libkvtier.so.{VERSION[0]}.{VERSION[1]}"
BUNDLED = Path(__file__).resolve().parent / "_lib" / SONAME

_p = POINTER
_key = _p(S.kvt_key)
_u32p = _p(c_uint32)
_u64p = _p(c_uint64)

# name: (restype, argtypes), in the order of the headers.
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    # core.h, error.h
    "kvt_ctx_create": (c_int, [_p(S.kvt_ctx_config), _p(c_void_p)]),
    "kvt_ctx_destroy": (None, [c_void_p]),
    "kvt_ctx_last_error": (c_char_p, [c_void_p]),
    "kvt_ctx_simd": (c_int, [c_void_p]),
    "kvt_version": (c_uint, []),
    "kvt_version_string": (c_char_p, []),
    "kvt_has_feature": (c_int, [c_char_p]),
    "kvt_strerror": (c_char_p, [c_int]),
    "kvt_err_name": (c_char_p, [c_int]),
    # codec.h
    "kvt_codec_parse": (c_int, [c_void_p, c_char_p, _p(S.kvt_codec_spec)]),
    "kvt_codec_format": (c_int, [_p(S.kvt_codec_spec), c_char_p, c_size_t]),
    "kvt_codec_validate": (c_int, [c_void_p, _p(S.kvt_codec_spec)]),
    "kvt_codec_layer_fmt": (c_int, [_p(S.kvt_codec_spec), c_uint32, c_int]),
    "kvt_fmt_name": (c_char_p, [c_int]),
    "kvt_dtype_name": (c_char_p, [c_int]),
    "kvt_kv_view_dense": (None, [c_void_p, c_void_p, c_void_p, c_int, c_uint32, c_uint32,
                                 c_uint32, c_uint32]),
    # key.h
    "kvt_fingerprint": (c_int, [_p(S.kvt_model_desc), _p(S.kvt_codec_spec), _key]),
    "kvt_chunk_key": (c_int, [_key, _key, _u32p, c_size_t, _key]),
    "kvt_chunk_keys": (c_int, [_key, _u32p, c_size_t, c_uint32, _key, c_size_t,
                               _p(c_size_t)]),
    "kvt_key_hex": (c_char_p, [_key, c_char_p]),
    "kvt_key_from_hex": (c_int, [c_char_p, _key]),
    # payload.h
    "kvt_encode_bound": (c_int, [c_void_p, _p(S.kvt_codec_spec), c_uint32, c_uint32, c_uint32,
                                 c_uint32, c_uint32, _u64p]),
    "kvt_encode": (c_int, [c_void_p, _p(S.kvt_encode_params), _p(S.kvt_kv_view), c_void_p,
                           c_size_t, _p(c_size_t)]),
    "kvt_payload_parse": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p]),
    "kvt_payload_verify": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p]),
    "kvt_payload_section": (c_int, [c_void_p, c_void_p, c_size_t, c_uint32, c_void_p]),
    "kvt_decode": (c_int, [c_void_p, c_void_p, c_size_t, _p(S.kvt_decode_params),
                           _p(S.kvt_kv_view)]),
    # tier.h (what the cache's users need)
    "kvt_tier_spec": (c_char_p, [c_void_p]),
    "kvt_tier_traits": (c_uint32, [c_void_p]),
    "kvt_parse_size": (c_int, [c_char_p, _u64p]),
    # cache.h
    "kvt_cache_open": (c_int, [c_void_p, _p(S.kvt_cache_config), _p(c_void_p)]),
    "kvt_cache_close": (None, [c_void_p]),
    "kvt_cache_put": (c_int, [c_void_p, _key, _key, c_void_p, c_uint64]),
    "kvt_cache_get": (c_int, [c_void_p, _key, c_void_p, c_uint64, _u64p, _p(c_int)]),
    "kvt_cache_get_many": (c_int, [c_void_p, _p(S.kvt_cache_get_req), c_size_t, c_uint32]),
    "kvt_cache_borrow": (c_int, [c_void_p, _key, _p(S.kvt_cache_loan)]),
    "kvt_cache_return": (None, [c_void_p, _p(S.kvt_cache_loan)]),
    "kvt_cache_reserve": (c_int, [c_void_p, _key, _key, c_uint64,
                                  _p(S.kvt_cache_reservation)]),
    "kvt_cache_publish": (c_int, [c_void_p, _p(S.kvt_cache_reservation)]),
    "kvt_cache_abort": (None, [c_void_p, _p(S.kvt_cache_reservation)]),
    "kvt_cache_lookup": (c_int, [c_void_p, _u32p, c_size_t, _p(c_size_t)]),
    "kvt_cache_lookup_keys": (c_int, [c_void_p, _key, c_size_t, _p(c_size_t)]),
    "kvt_cache_plan_restore": (c_int, [c_void_p, _u32p, c_size_t, _p(S.kvt_model_arch),
                                       c_double, c_double, _p(S.kvt_cache_plan)]),
    "kvt_cache_query": (c_int, [c_void_p, _key, _u64p, _p(c_int)]),
    "kvt_cache_where": (c_uint32, [c_void_p, _key]),
    "kvt_cache_del": (c_int, [c_void_p, _key]),
    "kvt_cache_tier_count": (c_int, [c_void_p]),
    "kvt_cache_tier": (c_void_p, [c_void_p, c_int]),
    "kvt_cache_stats_get": (c_int, [c_void_p, c_int, c_void_p]),
    # model.h
    "kvt_model_preset": (c_int, [c_char_p, c_void_p]),
    "kvt_model_preset_at": (c_int, [c_size_t, c_void_p]),
    "kvt_model_from_hf_config": (c_int, [c_void_p, c_char_p, c_size_t, c_char_p,
                                         _p(S.kvt_model_arch)]),
    "kvt_model_validate": (c_int, [c_void_p, _p(S.kvt_model_arch)]),
    "kvt_model_weight_bytes": (c_double, [_p(S.kvt_model_arch)]),
    "kvt_model_kv_rate_get": (c_int, [c_void_p, _p(S.kvt_model_arch), _p(S.kvt_codec_spec),
                                      c_void_p]),
    "kvt_model_seq_bytes": (c_double, [_p(S.kvt_model_kv_rate), c_double]),
    "kvt_model_bytes_per_element": (c_double, [_p(S.kvt_model_kv_rate)]),
    "kvt_model_project": (c_int, [c_void_p, _p(S.kvt_model_kv_rate),
                                  _p(S.kvt_model_projection_config), c_void_p]),
    "kvt_model_shortfall": (c_double, [c_double, c_double]),
    "kvt_model_max_context": (c_int, [c_void_p, _p(S.kvt_model_kv_rate),
                                      _p(S.kvt_model_projection_config), c_double,
                                      _p(c_double)]),
    "kvt_model_amdahl_bound": (c_double, [c_double, c_double]),
    "kvt_model_link_preset": (_p(S.kvt_model_link), [c_size_t]),
    "kvt_model_link_find": (_p(S.kvt_model_link), [c_char_p]),
    "kvt_model_prefill_flops": (c_double, [_p(S.kvt_model_arch), c_double]),
    "kvt_model_prefill_seconds": (c_double, [_p(S.kvt_model_arch), c_double, c_double,
                                             c_double]),
    "kvt_model_restore_seconds": (c_double, [c_double, c_double, c_double]),
}


def _load() -> tuple[ctypes.CDLL, str]:
    env = os.environ.get("KVTIER_LIBRARY")
    if env:
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise ImportError(f"kvtier: KVTIER_LIBRARY={env} does not load: {e}") from e
    tried = []
    if BUNDLED.exists():
        try:
            return ctypes.CDLL(str(BUNDLED)), str(BUNDLED)
        except OSError as e:
            tried.append(f"{BUNDLED}: {e}")
    else:
        tried.append(f"{BUNDLED}: not bundled")
    try:
        return ctypes.CDLL(SONAME), SONAME
    except OSError as e:
        tried.append(f"{SONAME} (system loader): {e}")
    raise ImportError(
        "kvtier: libkvtier not found; set KVTIER_LIBRARY to a built libkvtier.so, "
        "or install the package with the library bundled (README.md, Python). Tried:\n  "
        + "\n  ".join(tried)
    )


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _check_version(lib: ctypes.CDLL, path: str) -> None:
    n = lib.kvt_version()
    major, minor = n // 10000, n // 100 % 100
    if (major, minor) != VERSION[:2]:
        raise ImportError(
            f"kvtier: {path} is libkvtier {lib.kvt_version_string().decode()}; this package "
            f"binds {VERSION[0]}.{VERSION[1]}.x (major.minor must match)"
        )


def _extent(buf: ctypes.Array[Any], fill: int) -> int:
    """Bytes written at the start of buf, which was filled with `fill`."""
    raw = bytes(buf)
    n = len(raw)
    while n and raw[n - 1] == fill:
        n -= 1
    return n


def _reported_sizes(lib: ctypes.CDLL) -> dict[str, int]:
    """Struct sizes as the library itself reports them: the struct_size it
    writes, or the extent of a struct it writes whole (a zeroed reserved tail
    last, so the extent is the size)."""
    fill, cap = 0xA5, 1024
    out: dict[str, int] = {}

    def scratch() -> ctypes.Array[Any]:
        return (ctypes.c_uint8 * cap)(*([fill] * cap))

    def struct_size(buf: ctypes.Array[Any]) -> int:
        return ctypes.c_size_t.from_buffer(buf).value

    b = scratch()
    lib.kvt_kv_view_dense(b, None, None, 1, 1, 1, 1, 2)
    out["kvt_kv_view"] = struct_size(b)
    b = scratch()
    if lib.kvt_model_preset_at(0, b) == 0:
        out["kvt_model_arch"] = struct_size(b)
    spec = scratch()
    if lib.kvt_codec_parse(None, b"raw", ctypes.cast(spec, _p(S.kvt_codec_spec))) == 0:
        out["kvt_codec_spec"] = _extent(spec, fill)
    # A tiny raw payload to parse: header and section entries written whole.
    k = (ctypes.c_uint16 * 2)(0x3F80, 0x4000)
    view = S.kvt_kv_view()
    lib.kvt_kv_view_dense(ctypes.byref(view), k, k, 1, 1, 1, 1, 2)
    params = S.init(S.kvt_encode_params)
    params.spec = S.kvt_codec_spec.from_buffer_copy(bytes(spec)[: ctypes.sizeof(S.kvt_codec_spec)])
    ctx = c_void_p()
    cfg = S.init(S.kvt_ctx_config)
    cfg.log_level = S.KVT_LOG_WARN
    if lib.kvt_ctx_create(ctypes.byref(cfg), ctypes.byref(ctx)) != 0:
        return out
    try:
        payload = (ctypes.c_uint8 * 65536)()
        n = c_size_t()
        if lib.kvt_encode(ctx, ctypes.byref(params), ctypes.byref(view), payload,
                          len(payload), ctypes.byref(n)) == 0:
            info, sec = scratch(), scratch()
            if lib.kvt_payload_parse(ctx, payload, n.value, info) == 0:
                out["kvt_payload_info"] = _extent(info, fill)
            if lib.kvt_payload_section(ctx, payload, n.value, 0, sec) == 0:
                out["kvt_section_info"] = _extent(sec, fill)
    finally:
        lib.kvt_ctx_destroy(ctx)
    return out


def _check_layouts(lib: ctypes.CDLL, path: str) -> None:
    bad = [
        f"{name}: library {size}, binding {ctypes.sizeof(S.MIRRORED[name])}"
        for name, size in _reported_sizes(lib).items()
        if size != ctypes.sizeof(S.MIRRORED[name])
    ]
    if bad:
        raise ImportError(f"kvtier: {path} has other struct sizes than this binding: "
                          + "; ".join(bad))


def _open() -> tuple[ctypes.CDLL, str]:
    lib, path = _load()
    try:
        _declare(lib)
    except AttributeError as e:
        raise ImportError(f"kvtier: {path} lacks a function of the 0.3 API: {e}") from e
    _check_version(lib, path)
    _check_layouts(lib, path)
    return lib, path


lib, path = _open()
