"""kvtier.lmcache: LMCache stores its KV chunks in kvtier tiers (DRAM, NVMe,
Redis, kvtier-server), compressed by kvtier's codecs where their layout is
known and checked on every read. Written against LMCache 0.5.6.

LMCache loads it with its own storage_plugin_launcher (README, section LMCache):

    storage_plugins: ["kvtier"]
    extra_config:
      storage_plugin.kvtier.module_path: kvtier.lmcache
      storage_plugin.kvtier.class_name: KvtierStoragePlugin
      storage_plugin.kvtier.tiers: "nvme:/var/cache/kvtier/w{worker}:1TiB"
      storage_plugin.kvtier.codec: k16v8

What is stored, by the MemoryObj's format:
- KV_2LTD chunks ([2, layers, tokens, heads * head_dim], LMCache's chunk of a
  non-MLA model) in bf16 or fp16: encoded by the codec, K = [0], V = [1],
  heads and head_dim from LMCacheMetadata.kv_shape, read in place.
- Everything else (BINARY / BINARY_BUFFER bytes, KV_MLA_FMT, KV_2TD and
  KV_T2D of layer-wise and blending modes, fp8 or fp32 caches, heads that do
  not divide the hidden size): the object's bytes, unchanged, in a payload of
  the lossless "raw" codec, preceded by a descriptor (format, dtype, shape,
  length). Not compressed, but verified like the rest: every section
  checksum is checked before a byte reaches LMCache.
A payload that fails its checks (checksum, key, model, shape, descriptor) is
a miss: it is deleted and LMCache recomputes the chunk.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._buffers import DTYPE_BF16, DTYPE_F16, Tensor
from .cache import Cache
from .codec import CodecSpec, decode, encode_bound, encode_into
from .errors import PAYLOAD_FAULTS, Error, ErrorCode, Refused
from .keys import Key, ModelDesc, chunk_key, fingerprint
from .payload import inspect

LMCACHE_VERSION = "0.5.6"

try:
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat, MemoryObj
    from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"kvtier.lmcache needs LMCache {LMCACHE_VERSION} and torch ({_e}); "
        "'./bootstrap.sh lmcache' makes a venv with them") from _e

log = logging.getLogger("kvtier.lmcache")

_DTYPES = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16}


def _refuse(what: str, why: str) -> Refused:
    return Refused(f"kvtier.lmcache: {what}: {why}")


@dataclass(frozen=True)
class PluginConfig:
    """Our keys of LMCache's extra_config, each under
    "storage_plugin.<name>." (<name>: the plug-in's name in storage_plugins).

    tiers: kvtier tier specs, hottest first; "{worker}" is replaced by
        LMCache's worker id (each worker owns its nvme directory; its parent
        directories are made), "{world}" by the world size.
    codec: the codec of KV_2LTD chunks (default k16v8).
    threads: encode/decode threads (default: up to 8, the cores).
    model_id: the model's name in the fingerprint (default LMCache's).
    write_through: puts also reach the persistent tiers below (default on).
    verify: reads check every section checksum in the cache too (decoding
        checks them always).
    """

    tiers: str
    codec: str = "k16v8"
    threads: int = 8
    model_id: Optional[str] = None
    write_through: bool = True
    verify: bool = False

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], name: str) -> "PluginConfig":
        p = f"storage_plugin.{name}."
        tiers = extra.get(p + "tiers")
        if not isinstance(tiers, str) or not tiers:
            raise _refuse("no tiers", f'extra_config needs "{p}tiers", e.g. '
                          '"nvme:/var/cache/kvtier/w{worker}:1TiB"')
        codec = str(extra.get(p + "codec", "k16v8"))
        CodecSpec(codec)  # raises kvtier.Error (KVT_ESPEC) for a bad spec
        threads = int(extra.get(p + "threads", min(8, os.cpu_count() or 1)))
        if threads < 1:
            raise _refuse("threads", f"{threads} is not a positive count")
        return cls(tiers=tiers, codec=codec, threads=threads, model_id=extra.get(p + "model_id"),
                   write_through=_flag(extra.get(p + "write_through", True)),
                   verify=_flag(extra.get(p + "verify", False)))

    def worker_tiers(self, worker: int, world: int) -> str:
        """The tier spec of one worker, placeholders replaced; the parent
        directories of its nvme tiers are made."""
        parts = [s for s in self.tiers.split(";") if s]
        if world > 1 and any(s.startswith("nvme:") and "{worker}" not in s for s in parts):
            raise _refuse("one nvme directory for several workers",
                          f'each of the {world} workers owns its nvme directory: put "{{worker}}" '
                          'in its path, e.g. "nvme:/var/cache/kvtier/w{worker}:1TiB"')
        spec = self.tiers.replace("{worker}", str(worker)).replace("{world}", str(world))
        for part in spec.split(";"):
            if part.startswith("nvme:"):
                parent = os.path.dirname(part[len("nvme:"):].split(":", 1)[0].rstrip("/"))
                if parent:
                    os.makedirs(parent, exist_ok=True)
        return spec


def _flag(v: Any) -> bool:
    return v.lower() in ("1", "true", "yes", "on") if isinstance(v, str) else bool(v)


def plugin_name(extra: Mapping[str, Any], cls: type) -> str:
    """The name under which extra_config configures cls ("kvtier" if none)."""
    for k, v in extra.items():
        if k.startswith("storage_plugin.") and k.endswith(".class_name") and v == cls.__name__:
            name = k[len("storage_plugin."):-len(".class_name")]
            if extra.get(f"storage_plugin.{name}.module_path") == __name__:
                return name
    return "kvtier"


# --- the raw path's descriptor ---------------------------------------------------
# Written before the object's bytes inside a raw-codec payload (so covered by
# its section checksums): magic, format name, dtype name, rank, shape, length.
_DESC = struct.Struct("<8s16s24sI6QQ")
_DESC_LEN = 128
_MAGIC = b"KVTLMC1\0"
_READ_AHEAD = 16  # payloads one thread reads together
_RAW_ROW = 256  # bytes per token of a raw payload: K and V rows of 64 16-bit elements


@dataclass(frozen=True)
class Descriptor:
    fmt: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int

    def pack(self) -> bytes:
        dims = list(self.shape) + [0] * (6 - len(self.shape))
        b = _DESC.pack(_MAGIC, self.fmt.encode(), self.dtype.encode(), len(self.shape), *dims,
                       self.nbytes)
        return b + b"\0" * (_DESC_LEN - len(b))

    @classmethod
    def unpack(cls, b: bytes) -> "Descriptor":
        magic, fmt, dt, rank, *rest = _DESC.unpack_from(b)
        if magic != _MAGIC or rank > 6:
            raise Error(ErrorCode.EFORMAT, detail="kvtier.lmcache: no descriptor")
        return cls(fmt.rstrip(b"\0").decode(), dt.rstrip(b"\0").decode(), tuple(rest[:rank]),
                   rest[6])


def _raw_tokens(nbytes: int) -> int:
    return max(1, -(-(_DESC_LEN + nbytes) // _RAW_ROW))


def _raw_views(base: int, tokens: int, keep: Any) -> Tuple[Tensor, Tensor]:
    """K and V of a raw payload over the bytes at base: K the first half."""
    shape, strides = (1, tokens, 1, 64), (tokens * 64, 64, 64)
    half = tokens * _RAW_ROW // 2
    return (Tensor(base, shape, strides, DTYPE_F16, True, keep),
            Tensor(base + half, shape, strides, DTYPE_F16, True, keep))


class KvtierStoragePlugin(StoragePluginInterface):
    """LMCache's StoragePluginInterface over a kvtier cache. LMCache's
    storage_plugin_launcher builds it as backend_class(config=, dst_device=,
    metadata=, local_cpu_backend=, loop=); objects it returns are allocated
    by local_cpu_backend. Puts run on the plug-in's threads (the objects are
    held with ref_count_up until stored); gets block.

    pin/unpin count pins in this process: remove(key, force=False) leaves a
    pinned key, but kvtier's tiers evict by their own LRU under capacity
    pressure, pinned or not (a chunk evicted then is a miss, recomputed)."""

    def __init__(self, dst_device: str = "cpu", config: Any = None, metadata: Any = None,
                 local_cpu_backend: Any = None,
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        if metadata is None or local_cpu_backend is None:
            raise _refuse("no metadata or local_cpu_backend",
                          "LMCache's launcher gives both to a worker; the scheduler role has none")
        extra = dict(getattr(config, "extra_config", None) or {})
        self.name = plugin_name(extra, type(self))
        self.options = PluginConfig.from_extra(extra, self.name)
        self.tiers = self.options.worker_tiers(int(metadata.worker_id), int(metadata.world_size))
        self.geometry = self._geometry(metadata)
        self.fingerprint = self._fingerprint(metadata)
        self.cache = Cache(self.tiers, fingerprint=self.fingerprint,
                           chunk_tokens=int(getattr(metadata, "chunk_size", 256)),
                           write_through=self.options.write_through, verify=self.options.verify)
        self._pool = ThreadPoolExecutor(self.options.threads, thread_name_prefix="kvtier-lmcache")
        self._lock = threading.Lock()
        self._put_tasks: Dict[CacheEngineKey, int] = {}  # puts in flight
        self._pins: Dict[CacheEngineKey, int] = {}
        self._local = threading.local()
        self._lending = True  # until the only tier says it cannot lend
        log.info("kvtier.lmcache: worker %d/%d, kv_shape %s, codec %s, tiers %s",
                 metadata.worker_id, metadata.world_size, tuple(metadata.kv_shape),
                 self.options.codec, self.tiers)

    def __str__(self) -> str:
        return self.__class__.__name__

    # --- setup -------------------------------------------------------------------

    @staticmethod
    def _geometry(md: Any) -> Optional[Tuple[int, int, int, int]]:
        """(layers, heads, head_dim, dtype code) of the KV_2LTD chunks the codec
        encodes, or None where every object goes the raw path (MLA, not bf16
        or fp16)."""
        layers, _, _, heads, head_dim = (int(x) for x in md.kv_shape)
        if getattr(md, "use_mla", False) or md.kv_dtype not in _DTYPES:
            return None
        return layers, heads, head_dim, _DTYPES[md.kv_dtype]

    def _fingerprint(self, md: Any) -> Key:
        layers, _, _, heads, head_dim = (int(x) for x in md.kv_shape)
        model = self.options.model_id or md.model_name
        if not model:
            raise _refuse("no model name", f'set "storage_plugin.{self.name}.model_id"')
        if self.geometry is None:  # the raw path's bytes: the cache's dtype names them
            model = f"{model}#{'mla' if getattr(md, 'use_mla', False) else ''}{md.kv_dtype}"
        dtype = "fp16" if md.kv_dtype == torch.float16 else "bf16"
        desc = ModelDesc(model, layers=layers, kv_heads=heads, head_dim=head_dim, dtype=dtype,
                         tp_rank=int(md.worker_id), tp_size=int(md.world_size))
        return fingerprint(desc, self.options.codec)

    # --- keys --------------------------------------------------------------------

    def kv_key(self, key: CacheEngineKey, raw: bool) -> Key:
        """The kvtier key of an LMCache chunk: LMCache's key string (model,
        world size, worker id, chunk hash, dtype, layer of a layer-wise key,
        tags) and the path that stored it, under the plug-in's fingerprint."""
        b = f"{key.to_string()}|{'raw' if raw else 'codec'}".encode()
        b += b"\0" * (-len(b) % 4)
        return chunk_key(self.fingerprint, np.frombuffer(b, dtype="<u4"))

    def _held(self, key: CacheEngineKey) -> Optional[Tuple[Key, bool, int]]:
        """(kvtier key, raw, length) of the payload held for key, or None."""
        for raw in (False, True):
            k = self.kv_key(key, raw)
            try:
                q = self.cache.query(k)
            except Error as e:
                log.warning("kvtier.lmcache: query of %s failed: %s", key, e)
                continue
            if q is not None:
                return k, raw, q[0]
        return None

    # --- puts --------------------------------------------------------------------

    def _codec_views(self, obj: MemoryObj) -> Optional[Tuple[Tensor, Tensor]]:
        """K and V of a KV_2LTD chunk as the codec reads them, or None."""
        g = self.geometry
        meta = obj.metadata
        if g is None or meta.fmt != MemoryFormat.KV_2LTD or _DTYPES.get(meta.dtype) != g[3]:
            return None
        shape = tuple(int(x) for x in meta.shape)
        if len(shape) != 4 or shape[0] != 2 or shape[3] != g[1] * g[2] or shape[1] < 1:
            return None
        if obj.get_size() != int(np.prod(shape)) * 2:
            return None
        _, layers, tokens, hidden = shape
        ptr, half = obj.data_ptr, layers * tokens * hidden * 2
        dims, strides = (layers, tokens, g[1], g[2]), (tokens * hidden, hidden, g[2])
        return (Tensor(ptr, dims, strides, g[3], True, obj),
                Tensor(ptr + half, dims, strides, g[3], True, obj))

    def _buffer(self, size: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < size + 4096:
            buf = self._local.buf = np.empty(size + 4096, np.uint8)
        return buf[-buf.ctypes.data % 4096:][:size]

    def _encode(self, key: CacheEngineKey, obj: MemoryObj) -> Tuple[Key, np.ndarray]:
        """The kvtier key and payload of one object."""
        kv = self._codec_views(obj)
        if kv is not None:
            k = self.kv_key(key, False)
            layers, tokens, heads, head_dim = kv[0].shape
            buf = self._buffer(encode_bound(self.options.codec, layers, tokens, heads, head_dim))
            n = encode_into(buf, kv[0], kv[1], self.options.codec, key=k,
                            fingerprint=self.fingerprint)
            return k, buf[:n]
        meta = obj.metadata
        data = np.frombuffer(obj.byte_array, np.uint8)
        tokens = _raw_tokens(data.size)
        src = np.zeros(tokens * _RAW_ROW, np.uint8)  # the descriptor, the bytes, zeros
        dtype = "" if meta.dtype is None else str(meta.dtype).replace("torch.", "")
        desc = Descriptor(meta.fmt.name, dtype,
                          tuple(int(x) for x in meta.shape), int(data.size))
        src[:_DESC_LEN] = np.frombuffer(desc.pack(), np.uint8)
        src[_DESC_LEN:_DESC_LEN + data.size] = data
        k = self.kv_key(key, True)
        tk, tv = _raw_views(src.ctypes.data, tokens, src)
        buf = self._buffer(encode_bound("raw", 1, tokens, 1, 64))
        n = encode_into(buf, tk, tv, "raw", key=k, fingerprint=self.fingerprint)
        return k, buf[:n]

    def _put_one(self, key: CacheEngineKey, obj: MemoryObj,
                 done: Optional[Callable[[CacheEngineKey], None]]) -> bool:
        kk: Optional[Key] = None
        try:
            kk, payload = self._encode(key, obj)
            self.cache.put(kk, payload)
            stored = True
        except Error as e:
            stored = False
            if e.code == -errno.ENOSPC:
                log.info("kvtier.lmcache: no room for %s: %s", key, e)
            else:
                log.warning("kvtier.lmcache: store of %s failed: %s", key, e)
        finally:
            obj.ref_count_down()
            with self._lock:
                n = self._put_tasks.get(key, 1) - 1
                if n:
                    self._put_tasks[key] = n
                else:
                    self._put_tasks.pop(key, None)
        if stored and done is not None:
            try:
                done(key)
            except Exception as e:  # LMCache's contract: logged, not raised
                log.warning("kvtier.lmcache: on_complete_callback for %s failed: %s", key, e)
        return stored

    def batched_submit_put_task(self, keys: Sequence[CacheEngineKey], objs: List[MemoryObj],
                                transfer_spec: Any = None,
                                on_complete_callback: Optional[Callable[[CacheEngineKey], None]]
                                = None) -> List[Future]:
        """Stores each object on the plug-in's threads; one Future (True:
        stored) per object not already held or in flight."""
        futures = []
        for key, obj in zip(keys, objs):
            with self._lock:
                if key in self._put_tasks:
                    continue
            if self._held(key) is not None:
                continue
            obj.ref_count_up()
            with self._lock:
                self._put_tasks[key] = self._put_tasks.get(key, 0) + 1
            futures.append(self._pool.submit(self._put_one, key, obj, on_complete_callback))
        return futures

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._put_tasks

    # --- gets --------------------------------------------------------------------

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self._get_span([key])[0]

    def _get_span(self, keys: Sequence[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """The objects of keys (None: a miss). Payloads are read together
        (kvt_cache_get_many: the nvme tier keeps the reads in flight at once)
        into this thread's buffer, _READ_AHEAD at a time, then decoded."""
        out: List[Optional[MemoryObj]] = [None] * len(keys)
        held = [(i, h) for i, h in enumerate(map(self._held, keys)) if h is not None]
        if self._lending:  # decoded from a memory tier's own bytes, without a copy
            held = [(i, h) for i, h in held if not self._get_lent(keys[i], h[0], h[1], out, i)]
        for c in range(0, len(held), _READ_AHEAD):
            part = held[c:c + _READ_AHEAD]
            slot = -(-max(h[2] for _, h in part) // 4096) * 4096
            buf = self._buffer(slot * len(part))
            slots = [buf[j * slot:(j + 1) * slot] for j in range(len(part))]
            try:
                got = self.cache.get_many_into([h[0] for _, h in part], slots)
            except Error as e:
                log.warning("kvtier.lmcache: read of %d chunks failed: %s", len(part), e)
                continue
            for j, (i, (kk, raw, _)) in enumerate(part):
                if got[j].code == 0:
                    out[i] = self._decode(keys[i], kk, raw, slots[j][:got[j].length])
                elif got[j].code != ErrorCode.ENOTFOUND:  # refused (and deleted) by the cache
                    log.warning("kvtier.lmcache: %s is a miss: %s", keys[i],
                                Error(got[j].code, detail="get"))
        return out

    def _get_lent(self, key: CacheEngineKey, kk: Key, raw: bool,
                  out: List[Optional[MemoryObj]], i: int) -> bool:
        """Decodes kk's payload from the memory tier lending it into out[i];
        False where no tier lends it (then it is read with the others)."""
        try:
            loan = self.cache.borrow(kk)
        except Error as e:
            if e.code == ErrorCode.ENOTSUP and self.cache.tier_count == 1:
                self._lending = False  # the only tier cannot lend (nvme, remote)
            if e.code not in (ErrorCode.ENOTSUP, -errno.EAGAIN):
                log.warning("kvtier.lmcache: %s is a miss: %s", key, e)
            return e.code not in (ErrorCode.ENOTSUP, -errno.EAGAIN)
        if loan is None or loan.array is None:  # a miss here; a shared tier may have it
            if loan is not None:
                loan.close()
            return False
        with loan:  # a delete of the key waits for the loan: drop after it
            try:
                out[i] = (self._decode_raw if raw else self._decode_codec)(kk, loan.array)
                return True
            except Error as e:
                fault = e
        log.warning("kvtier.lmcache: %s is a miss: %s", key, fault)
        if fault.code in PAYLOAD_FAULTS:
            self._drop(kk)
        return True

    def _decode(self, key: CacheEngineKey, kk: Key, raw: bool,
                payload: np.ndarray) -> Optional[MemoryObj]:
        """The object decoded from payload; None (and the payload deleted
        when its bytes are at fault) where it fails a check."""
        try:
            return (self._decode_raw if raw else self._decode_codec)(kk, payload)
        except Error as e:
            log.warning("kvtier.lmcache: %s is a miss: %s", key, e)
            if e.code in PAYLOAD_FAULTS:
                self._drop(kk)
            return None

    def _decode_codec(self, kk: Key, payload: np.ndarray) -> Optional[MemoryObj]:
        g = self.geometry
        info = inspect(payload)
        if g is None or (info.layers, info.heads, info.head_dim) != (g[0], g[1], g[2]):
            raise Error(ErrorCode.ESHAPE, detail=f"payload of {info.layers} layers, {info.heads}"
                        f" heads of {info.head_dim}; the model has {g}")
        dtype = torch.bfloat16 if info.dtype == "bf16" else torch.float16
        shape = torch.Size([2, info.layers, info.tokens, info.heads * info.head_dim])
        obj = self._allocate(shape, dtype, MemoryFormat.KV_2LTD)
        if obj is None:
            log.warning("kvtier.lmcache: LMCache's allocator has no room for %s", tuple(shape))
            return None
        kv = self._codec_views(obj)
        assert kv is not None
        try:
            decode(payload, kv[0], kv[1], expect_key=kk, expect_fingerprint=self.fingerprint)
        except BaseException:
            obj.ref_count_down()
            raise
        return obj

    def _allocate(self, shape: Any, dtype: Any, fmt: Any) -> Optional[MemoryObj]:
        """An object from LMCache's allocator, or None (full, or a format
        it does not allocate, such as BINARY in 0.5.6)."""
        try:
            return self.local_cpu_backend.allocate(shape, dtype, fmt)
        except ValueError as e:
            log.warning("kvtier.lmcache: LMCache cannot allocate %s %s: %s", fmt, tuple(shape), e)
            return None

    def _decode_raw(self, kk: Key, payload: np.ndarray) -> Optional[MemoryObj]:
        info = inspect(payload)
        if (info.layers, info.heads, info.head_dim, info.dtype) != (1, 1, 64, "fp16"):
            raise Error(ErrorCode.ESHAPE, detail="not a raw-path payload of kvtier.lmcache")
        dst = np.empty(info.tokens * _RAW_ROW, np.uint8)
        tk, tv = _raw_views(dst.ctypes.data, info.tokens, dst)
        decode(payload, tk, tv, expect_key=kk, expect_fingerprint=self.fingerprint)
        d = Descriptor.unpack(dst[:_DESC_LEN].tobytes())
        dtype = getattr(torch, d.dtype, None) if d.dtype else None  # BINARY_BUFFER: none
        fmt = MemoryFormat.__members__.get(d.fmt)
        if ((d.dtype and not isinstance(dtype, torch.dtype)) or fmt is None
                or _DESC_LEN + d.nbytes > dst.size or _raw_tokens(d.nbytes) != info.tokens):
            raise Error(ErrorCode.ECORRUPT, detail=f"kvtier.lmcache: bad descriptor {d}")
        obj = self._allocate(torch.Size(d.shape), dtype, fmt)
        if obj is None:
            log.warning("kvtier.lmcache: LMCache's allocator has no room for %s", d)
            return None
        if obj.get_size() < d.nbytes:
            obj.ref_count_down()
            raise Error(ErrorCode.ECORRUPT, detail=f"kvtier.lmcache: {d} in {obj.get_size()} B")
        if obj.get_size() != d.nbytes:
            obj.set_used_size(d.nbytes)
        np.frombuffer(obj.byte_array, np.uint8)[:] = dst[_DESC_LEN:_DESC_LEN + d.nbytes]
        return obj

    def batched_get_blocking(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """The objects of keys, in consecutive spans, one per thread."""
        n, threads = len(keys), self.options.threads
        if n < 4 or threads == 1:
            return self._get_span(keys)
        step = -(-n // threads)
        spans = [keys[s:s + step] for s in range(0, n, step)]
        return [o for part in self._pool.map(self._get_span, spans) for o in part]

    async def batched_get_non_blocking(self, lookup_id: str, keys: list,
                                       transfer_spec: Any = None) -> list:
        """The hit prefix of keys, read on the plug-in's threads."""
        loop = asyncio.get_running_loop()
        objs = await loop.run_in_executor(None, self.batched_get_blocking, list(keys))
        out = []
        for i, o in enumerate(objs):
            if o is None:
                for rest in objs[i + 1:]:
                    if rest is not None:
                        rest.ref_count_down()
                break
            out.append(o)
        return out

    # --- lookups, pins, removal ---------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if self._held(key) is None:
            return False
        if pin:
            self.pin(key)
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                     pin: bool = False) -> int:
        return self.batched_contains(keys, pin)

    def pin(self, key: CacheEngineKey) -> bool:
        if self._held(key) is None:
            return False
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
        return True

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            n = self._pins.get(key, 0)
            if not n:
                return False
            if n == 1:
                del self._pins[key]
            else:
                self._pins[key] = n - 1
        return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        """Deletes key's payloads; a pinned key only with force."""
        with self._lock:
            if not force and self._pins.get(key):
                return False
            self._pins.pop(key, None)
        removed = False
        for raw in (False, True):
            removed |= self._drop(self.kv_key(key, raw))
        return removed

    def _drop(self, kk: Key) -> bool:
        try:
            return bool(self.cache.delete(kk))
        except Error as e:
            log.warning("kvtier.lmcache: could not delete %s: %s", kk, e)
            return False

    def touch_cache(self) -> None:
        """kvtier's tiers keep their own LRU (hits refresh it)."""

    def get_allocator_backend(self) -> Any:
        return self.local_cpu_backend

    def kvtier_stats(self) -> Any:
        """kvtier's cache counters (kvtier.CacheStats)."""
        return self.cache.stats() if self.cache is not None else None

    def close(self) -> None:
        """Waits for the puts in flight, then closes the cache."""
        self._pool.shutdown(wait=True)
        if self.cache is not None:
            self.cache.close()
            self.cache = None  # type: ignore[assignment]
