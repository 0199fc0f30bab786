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
  the lossless "raw" codec, preceded by a descriptor (format, then the dtype
  and shape of each KV group, length). Not compressed, but verified like the rest: every section
  checksum is checked before a byte reaches LMCache.
A payload that fails its checks (checksum, key, model, shape, descriptor) is
a miss: it is deleted and LMCache recomputes the chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import struct
import sys
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._buffers import DTYPE_BF16, DTYPE_F16, Tensor
from .cache import Cache
from ._engines import EngineOptions, borrow_lent, options_from
from .codec import decode, encode_bound, encode_into
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
class PluginConfig(EngineOptions):
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

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], name: str) -> "PluginConfig":
        p = f"storage_plugin.{name}."
        return cls(**options_from(extra, p, _refuse, f'extra_config needs "{p}tiers", e.g. '
                                  '"nvme:/var/cache/kvtier/w{worker}:1TiB"'))

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


def plugin_name(extra: Mapping[str, Any], cls: type, launching: Optional[str] = None) -> str:
    """The name under which extra_config configures cls ("kvtier" if none).
    Where several names do, launching (the name LMCache's launcher is
    building) picks one; without it they are refused."""
    names = []
    for k, v in extra.items():
        if k.startswith("storage_plugin.") and k.endswith(".class_name") and v == cls.__name__:
            name = k[len("storage_plugin."):-len(".class_name")]
            if extra.get(f"storage_plugin.{name}.module_path") == __name__:
                names.append(name)
    if len(names) <= 1:
        return names[0] if names else "kvtier"
    if launching in names:
        return launching
    raise _refuse("several plug-ins", f"extra_config configures {sorted(names)} as "
                  f"{__name__}.{cls.__name__} and none is being launched by LMCache's "
                  "storage_plugin_launcher")


def _launching_name() -> Optional[str]:
    """The plug-in name LMCache 0.5.6's storage_plugin_launcher is building:
    it gives the constructor no name, but its loop variable holds it."""
    f = sys._getframe(1)
    for _ in range(8):
        f = f.f_back  # type: ignore[assignment]
        if f is None:
            return None
        if f.f_code.co_name == "storage_plugin_launcher":
            name = f.f_locals.get("storage_plugin")
            return name if isinstance(name, str) else None
    return None


# --- the raw path's descriptor ---------------------------------------------------
# Written before the object's bytes inside a raw-codec payload (so covered by
# its section checksums): magic, format name, group count, length, then per KV
# group (LMCache's MemoryObjMetadata.shapes/dtypes) its dtype name, rank and
# shape; padded to 64 bytes.
_DESC_HEAD = struct.Struct("<8s16sIIQ")
_DESC_GROUP = struct.Struct("<24sI6Q")
_MAX_GROUPS = 16
_MAX_RANK = 6
_MAGIC = b"KVTLMC2\0"
_READ_AHEAD = 16  # payloads one thread reads together
_RAW_ROW = 256  # bytes per token of a raw payload: K and V rows of 64 16-bit elements


@dataclass(frozen=True)
class Descriptor:
    """What the raw path restores: the format, each KV group's dtype name
    ("" for none: BINARY_BUFFER) and shape, and the length in bytes."""

    fmt: str
    groups: Tuple[Tuple[str, Tuple[int, ...]], ...]
    nbytes: int

    @property
    def length(self) -> int:
        return -(-(_DESC_HEAD.size + _DESC_GROUP.size * len(self.groups)) // 64) * 64

    def expected_nbytes(self) -> Optional[int]:
        """The groups' elements times their size; None where a dtype is not named."""
        total = 0
        for dt, shape in self.groups:
            dtype = getattr(torch, dt, None) if dt else None
            if not isinstance(dtype, torch.dtype):
                return None
            total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return total

    def pack(self) -> bytes:
        b = _DESC_HEAD.pack(_MAGIC, self.fmt.encode(), len(self.groups), 0, self.nbytes)
        for dt, shape in self.groups:
            b += _DESC_GROUP.pack(dt.encode(), len(shape),
                                  *(list(shape) + [0] * (_MAX_RANK - len(shape))))
        return b + b"\0" * (self.length - len(b))

    @classmethod
    def unpack(cls, b: bytes) -> "Descriptor":
        if len(b) < _DESC_HEAD.size:
            raise Error(ErrorCode.ECORRUPT, detail="kvtier.lmcache: no descriptor")
        magic, fmt, count, _, nbytes = _DESC_HEAD.unpack_from(b)
        if magic != _MAGIC or not 1 <= count <= _MAX_GROUPS or \
                len(b) < _DESC_HEAD.size + count * _DESC_GROUP.size:
            raise Error(ErrorCode.ECORRUPT, detail="kvtier.lmcache: no descriptor")
        groups = []
        for g in range(count):
            dt, rank, *dims = _DESC_GROUP.unpack_from(b, _DESC_HEAD.size + g * _DESC_GROUP.size)
            if rank > _MAX_RANK:
                raise Error(ErrorCode.ECORRUPT, detail=f"kvtier.lmcache: group {g} of rank {rank}")
            groups.append((dt.rstrip(b"\0").decode(errors="replace"), tuple(dims[:rank])))
        return cls(fmt.rstrip(b"\0").decode(errors="replace"), tuple(groups), nbytes)

    @classmethod
    def of(cls, meta: Any, nbytes: int) -> "Descriptor":
        """The descriptor of an object's metadata; ESHAPE where the raw path
        cannot restore it (too many groups or dimensions, a length other
        than its shapes give)."""
        shapes = meta.shapes if meta.shapes else [meta.shape]
        dtypes = meta.dtypes if meta.dtypes else [meta.dtype]
        if len(shapes) != len(dtypes) or not 1 <= len(shapes) <= _MAX_GROUPS or \
                any(len(s) > _MAX_RANK for s in shapes):
            raise Error(ErrorCode.ESHAPE, detail=f"kvtier.lmcache: {len(shapes)} shapes "
                        f"{[tuple(s) for s in shapes]} and {len(dtypes)} dtypes")
        d = cls(meta.fmt.name, tuple(("" if t is None else str(t).replace("torch.", ""),
                                      tuple(int(x) for x in s)) for s, t in zip(shapes, dtypes)),
                nbytes)
        want = d.expected_nbytes()
        if want is not None and want != nbytes:
            raise Error(ErrorCode.ESHAPE, detail=f"kvtier.lmcache: {d.groups} make {want} "
                        f"bytes, the object has {nbytes}")
        return d


def _raw_tokens(nbytes: int) -> int:
    """Tokens of the raw payload of nbytes (descriptor included)."""
    return max(1, -(-nbytes // _RAW_ROW))


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
    by local_cpu_backend. Puts run on the plug-in's put threads (the objects
    are held with ref_count_up until stored); gets block, spans of a batch on
    the get threads. Closing LMCache's LocalCPUBackend (which frees the memory
    of the objects being stored; StorageManager.close() closes it first) waits
    for the running puts and drops the queued ones.

    pin/unpin count pins in this process: remove(key, force=False) leaves a
    pinned key, but kvtier's tiers evict by their own LRU under capacity
    pressure, pinned or not (a chunk evicted then is a miss, recomputed).
    batched_get_non_blocking unpins the keys it loads (LMCache's async lookup
    pins them with batched_async_contains and never unpins them itself).

    Workers only: LMCache's scheduler role (its lookup process) has no
    local_cpu_backend, and the plug-in refuses to load there; a scheduler
    that looks chunks up asynchronously asks the workers instead."""

    def __init__(self, dst_device: str = "cpu", config: Any = None, metadata: Any = None,
                 local_cpu_backend: Any = None,
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        if metadata is None or local_cpu_backend is None:
            raise _refuse("no metadata or local_cpu_backend",
                          "LMCache's launcher gives both to a worker; the scheduler role has none")
        extra = dict(getattr(config, "extra_config", None) or {})
        self.name = plugin_name(extra, type(self), _launching_name())
        self.options = PluginConfig.from_extra(extra, self.name)
        self.tiers = self.options.worker_tiers(int(metadata.worker_id), int(metadata.world_size))
        self.geometry = self._geometry(metadata)
        self.fingerprint = self._fingerprint(metadata)
        self.cache = Cache(self.tiers, fingerprint=self.fingerprint,
                           chunk_tokens=int(getattr(metadata, "chunk_size", 256)),
                           write_through=self.options.write_through, verify=self.options.verify)
        threads = self.options.threads
        self._puts = ThreadPoolExecutor(threads, thread_name_prefix="kvtier-lmcache-put")
        self._gets = ThreadPoolExecutor(threads, thread_name_prefix="kvtier-lmcache-get")
        self._lock = threading.Condition()
        self._put_tasks: Dict[CacheEngineKey, int] = {}  # puts in flight
        self._pins: Dict[CacheEngineKey, int] = {}
        self._reading = 0  # gets in flight (under _lock)
        self._closing = False  # set once (under _lock): no new call, queued puts dropped
        self._local = threading.local()
        self._lending = True  # until the only tier says it cannot lend
        self._drain_before_close(local_cpu_backend)
        log.info("kvtier.lmcache: worker %d/%d, kv_shape %s, codec %s, tiers %s",
                 metadata.worker_id, metadata.world_size, tuple(metadata.kv_shape),
                 self.options.codec, self.tiers)

    def __str__(self) -> str:
        return self.__class__.__name__

    def _drain_before_close(self, cpu: Any) -> None:
        """Makes cpu.close() (it frees the memory our puts and gets read and
        write) wait for our calls in flight first. A weak reference: the
        backend does not keep a closed plug-in alive."""
        me, inner = weakref.ref(self), cpu.close

        def close(*a: Any, **kw: Any) -> Any:
            plugin = me()
            if plugin is not None:
                plugin._drain()
            return inner(*a, **kw)
        cpu.close = close

    def _drain(self) -> None:
        """Refuses new calls, drops the queued puts (their references given
        back), waits for the running puts and gets."""
        with self._lock:
            self._closing = True
        self._puts.shutdown(wait=True)
        self._gets.shutdown(wait=True)
        with self._lock:
            self._lock.wait_for(lambda: self._reading == 0)

    def _check_open(self) -> None:
        if self._closing:
            raise ValueError(f"kvtier.lmcache: the plug-in {self.name} is closed")

    @contextlib.contextmanager
    def _reading_call(self) -> Iterator[None]:
        with self._lock:
            self._check_open()
            self._reading += 1
        try:
            yield
        finally:
            with self._lock:
                self._reading -= 1
                self._lock.notify_all()

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
        if g is None or meta.fmt != MemoryFormat.KV_2LTD or _DTYPES.get(meta.dtype) != g[3] \
                or (meta.shapes is not None and len(meta.shapes) != 1):
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
        data = np.frombuffer(obj.byte_array, np.uint8)
        desc = Descriptor.of(obj.metadata, int(data.size))
        tokens = _raw_tokens(desc.length + data.size)
        src = np.zeros(tokens * _RAW_ROW, np.uint8)  # the descriptor, the bytes, zeros
        src[:desc.length] = np.frombuffer(desc.pack(), np.uint8)
        src[desc.length:desc.length + data.size] = data
        k = self.kv_key(key, True)
        tk, tv = _raw_views(src.ctypes.data, tokens, src)
        buf = self._buffer(encode_bound("raw", 1, tokens, 1, 64))
        n = encode_into(buf, tk, tv, "raw", key=k, fingerprint=self.fingerprint)
        return k, buf[:n]

    def _put_one(self, key: CacheEngineKey, obj: MemoryObj,
                 done: Optional[Callable[[CacheEngineKey], None]]) -> bool:
        stored = False
        try:
            if not self._closing:  # else dropped: LMCache is freeing obj's memory
                kk, payload = self._encode(key, obj)
                self.cache.put(kk, payload)
                stored = True
        except Error as e:
            if e.code == -errno.ENOSPC:
                log.info("kvtier.lmcache: no room for %s: %s", key, e)
            else:
                log.warning("kvtier.lmcache: store of %s failed: %s", key, e)
        except Exception as e:  # a Future nobody reads: logged, or it is lost
            log.error("kvtier.lmcache: store of %s failed: %s: %s", key, type(e).__name__, e)
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
        self._check_open()
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
            futures.append(self._puts.submit(self._put_one, key, obj, on_complete_callback))
        return futures

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._put_tasks

    # --- gets --------------------------------------------------------------------

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self._get_span([key])[0]

    def _get_span(self, keys: Sequence[CacheEngineKey],
                  busy: bool = True) -> List[Optional[MemoryObj]]:
        """The objects of keys (None: a miss); busy: wait for LMCache's memory
        (else a miss where it is full). On an exception, the objects already
        made are given back."""
        out: List[Optional[MemoryObj]] = [None] * len(keys)
        with self._reading_call():
            try:
                self._read_span(keys, busy, out)
            except BaseException:
                _release(out)
                raise
        return out

    def _read_span(self, keys: Sequence[CacheEngineKey], busy: bool,
                   out: List[Optional[MemoryObj]]) -> None:
        """Fills out: payloads are read together (kvt_cache_get_many: the nvme
        tier keeps the reads in flight at once) into this thread's buffer,
        _READ_AHEAD at a time, then decoded."""
        held = [(i, h) for i, h in enumerate(map(self._held, keys)) if h is not None]
        if self._lending:  # decoded from a memory tier's own bytes, without a copy
            held = [(i, h) for i, h in held
                    if not self._get_lent(keys[i], h[0], h[1], out, i, busy)]
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
                    out[i] = self._decode(keys[i], kk, raw, slots[j][:got[j].length], busy)
                elif got[j].code != ErrorCode.ENOTFOUND:  # refused (and deleted) by the cache
                    log.warning("kvtier.lmcache: %s is a miss: %s", keys[i],
                                Error(got[j].code, detail="get"))

    def _get_lent(self, key: CacheEngineKey, kk: Key, raw: bool,
                  out: List[Optional[MemoryObj]], i: int, busy: bool) -> bool:
        """Decodes kk's payload from the memory tier lending it into out[i];
        False where no tier lends it (then it is read with the others)."""
        loan, miss, lends = borrow_lent(self.cache, kk)
        if not lends:
            self._lending = False  # the only tier cannot lend (nvme, remote)
        if miss is not None:
            log.warning("kvtier.lmcache: %s is a miss: %s", key, miss)
            return True
        if loan is None:  # a miss here; a shared tier may have it
            return False
        with loan:  # a delete of the key waits for the loan: drop after it
            try:
                out[i] = (self._decode_raw if raw else self._decode_codec)(kk, loan.array, busy)
                return True
            except Error as e:  # code and text only: e's frames hold the object
                code, why = e.code, str(e)
        log.warning("kvtier.lmcache: %s is a miss: %s", key, why)
        if code in PAYLOAD_FAULTS:
            self._drop(kk)
        return True

    def _decode(self, key: CacheEngineKey, kk: Key, raw: bool,
                payload: np.ndarray, busy: bool) -> Optional[MemoryObj]:
        """The object decoded from payload; None (and the payload deleted
        when its bytes are at fault) where it fails a check."""
        try:
            return (self._decode_raw if raw else self._decode_codec)(kk, payload, busy)
        except Error as e:
            log.warning("kvtier.lmcache: %s is a miss: %s", key, e)
            if e.code in PAYLOAD_FAULTS:
                self._drop(kk)
            return None

    def _decode_codec(self, kk: Key, payload: np.ndarray, busy: bool) -> Optional[MemoryObj]:
        g = self.geometry
        info = inspect(payload)
        if g is None or (info.layers, info.heads, info.head_dim) != (g[0], g[1], g[2]):
            raise Error(ErrorCode.ESHAPE, detail=f"payload of {info.layers} layers, {info.heads}"
                        f" heads of {info.head_dim}; the model has {g}")
        dtype = torch.bfloat16 if info.dtype == "bf16" else torch.float16
        shape = torch.Size([2, info.layers, info.tokens, info.heads * info.head_dim])
        obj = self._allocate(shape, dtype, MemoryFormat.KV_2LTD, busy)
        if obj is None:
            return None
        kv = self._codec_views(obj)
        assert kv is not None
        try:
            decode(payload, kv[0], kv[1], expect_key=kk, expect_fingerprint=self.fingerprint)
        except BaseException:
            obj.ref_count_down()
            raise
        return obj

    def _allocate(self, shape: Any, dtype: Any, fmt: Any, busy: bool) -> Optional[MemoryObj]:
        """An object from LMCache's allocator, or None (full, or a format it
        does not allocate, such as BINARY in 0.5.6). busy: wait until LMCache
        finds room (its busy_loop, for blocking reads only: on its event loop
        that wait may never end)."""
        try:
            obj = self.local_cpu_backend.allocate(shape, dtype, fmt, busy_loop=busy)
        except ValueError as e:
            log.warning("kvtier.lmcache: LMCache cannot allocate %s %s: %s", fmt, shape, e)
            return None
        if obj is None:
            log.warning("kvtier.lmcache: LMCache's allocator has no room for %s %s", fmt, shape)
        return obj

    def _decode_raw(self, kk: Key, payload: np.ndarray, busy: bool) -> Optional[MemoryObj]:
        info = inspect(payload)
        if (info.layers, info.heads, info.head_dim, info.dtype) != (1, 1, 64, "fp16"):
            raise Error(ErrorCode.ESHAPE, detail="not a raw-path payload of kvtier.lmcache")
        dst = np.empty(info.tokens * _RAW_ROW, np.uint8)
        tk, tv = _raw_views(dst.ctypes.data, info.tokens, dst)
        decode(payload, tk, tv, expect_key=kk, expect_fingerprint=self.fingerprint)
        d = Descriptor.unpack(dst[:_DESC_HEAD.size + _MAX_GROUPS * _DESC_GROUP.size].tobytes())
        dtypes = [getattr(torch, dt, None) if dt else None for dt, _ in d.groups]
        fmt = MemoryFormat.__members__.get(d.fmt)
        want = d.expected_nbytes()
        if (any(dt and not isinstance(t, torch.dtype) for (dt, _), t in zip(d.groups, dtypes))
                or fmt is None or d.length + d.nbytes > dst.size
                or _raw_tokens(d.length + d.nbytes) != info.tokens
                or (want is not None and want != d.nbytes)):
            raise Error(ErrorCode.ECORRUPT, detail=f"kvtier.lmcache: bad descriptor {d}")
        shapes = [torch.Size(s) for _, s in d.groups]
        if len(shapes) == 1:  # the form LMCache's own backends allocate
            obj = self._allocate(shapes[0], dtypes[0], fmt, busy)
        else:
            obj = self._allocate(shapes, dtypes, fmt, busy)
        if obj is None:
            return None
        if obj.get_size() < d.nbytes:
            obj.ref_count_down()
            raise Error(ErrorCode.ECORRUPT, detail=f"kvtier.lmcache: {d} in {obj.get_size()} B")
        if obj.get_size() != d.nbytes:
            obj.set_used_size(d.nbytes)
        np.frombuffer(obj.byte_array, np.uint8)[:] = dst[d.length:d.length + d.nbytes]
        return obj

    def batched_get_blocking(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """The objects of keys, in consecutive spans, one per thread."""
        return self._get_all(keys, True)

    def _get_all(self, keys: Sequence[CacheEngineKey], busy: bool) -> List[Optional[MemoryObj]]:
        """The objects of keys, spans on the get threads. Where a span raises,
        every object made is given back and its exception raised."""
        n, threads = len(keys), self.options.threads
        if n < 4 or threads == 1:
            return self._get_span(keys, busy)
        self._check_open()
        step = -(-n // threads)
        futures = [self._gets.submit(self._get_span, keys[s:s + step], busy)
                   for s in range(0, n, step)]
        out: List[Optional[MemoryObj]] = []
        failed: Optional[BaseException] = None
        for f in futures:
            try:
                out.extend(f.result())
            except BaseException as e:  # noqa: B036 - raised below, after the others end
                failed = failed or e
        if failed is not None:
            _release(out)
            raise failed
        return out

    async def batched_get_non_blocking(self, lookup_id: str, keys: list,
                                       transfer_spec: Any = None) -> list:
        """The hit prefix of keys, read on the plug-in's threads without
        waiting for LMCache's memory (a full buffer ends the prefix). Unpins
        keys: LMCache's async lookup pinned them (batched_async_contains)."""
        loop = asyncio.get_running_loop()
        try:
            objs = await loop.run_in_executor(None, self._get_all, list(keys), False)
        finally:
            for k in keys:
                self.unpin(k)
        out = []
        for i, o in enumerate(objs):
            if o is None:
                _release(objs[i + 1:])
                break
            out.append(o)
        return out

    # --- lookups, pins, removal ---------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        self._check_open()
        if self._held(key) is None:
            return False
        if pin:
            self.pin(key)
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                     pin: bool = False) -> int:
        return self.batched_contains(keys, pin)

    def pin(self, key: CacheEngineKey) -> bool:
        self._check_open()
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
        self._check_open()
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
        self._check_open()
        return self.cache.stats()

    def close(self) -> None:
        """Waits for the puts and gets in flight (queued puts are dropped),
        then closes the cache; later calls raise ValueError."""
        self._drain()
        self.cache.close()


def _release(objs: Sequence[Optional[MemoryObj]]) -> None:
    """Gives back the objects made for a read that does not return them."""
    for o in objs:
        if o is not None:
            o.ref_count_down()
