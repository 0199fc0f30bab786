"""kvtier.sglang: SGLang's hierarchical cache (HiCache) stores its L3 pages in
kvtier tiers (DRAM, NVMe, Redis, kvtier-server), compressed by kvtier's codecs
and checked on every read. Written against SGLang 0.5.23.

SGLang loads it by name, with the zero-copy interface (README, section SGLang):

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
      --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "tiers": "nvme:/var/cache/kvtier/r{rank}:1TiB",
        "codec": "k16v8"}'

Each page of SGLang's host pool becomes one kvtier payload, encoded straight
from the host pool's memory and decoded straight back into it (the pointers of
get_page_buffer_meta, read through strides: no copy of the page), on several
threads. A page whose payload fails its checks (checksum, key, model, shape)
is a miss: it is deleted and SGLang recomputes it. Each tensor-parallel rank
keeps its own payloads: its rank is in the fingerprint, and "{rank}" in the
tier spec gives it its own directory.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._buffers import DTYPE_BF16, DTYPE_F16, Tensor
from .cache import Cache
from ._engines import EngineOptions, borrow_lent, options_from
from .codec import decode, encode_bound, encode_into
from .errors import PAYLOAD_FAULTS, Error, ErrorCode, Refused
from .keys import Key, ModelDesc, chunk_key, fingerprint

SGLANG_VERSION = "0.5.23"

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                      HiCacheStorageExtraInfo)
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"kvtier.sglang needs SGLang {SGLANG_VERSION} and torch ({_e}); "
        "'./bootstrap.sh sglang' makes a venv with them") from _e

log = logging.getLogger("kvtier.sglang")

def _refuse(what: str, why: str) -> Refused:
    return Refused(f"kvtier.sglang: {what}: {why}")


@dataclass(frozen=True)
class BackendConfig(EngineOptions):
    """Our keys of --hicache-storage-backend-extra-config (README, SGLang).

    tiers: kvtier tier specs, hottest first; "{rank}" is replaced by the
        tensor-parallel rank, followed by "-dp{dp_rank}" in data-parallel
        replicas other than the first and "-cp{attn_cp_rank}" under context
        parallelism, so that it names one process; "{tp_size}", "{pp_rank}",
        "{dp_rank}" and "{cp_rank}" by what they say (an nvme directory
        belongs to one process; its parent directories are made).
    codec: the codec of the payloads (default k16v8).
    threads: encode/decode threads per rank (default: up to 8, the cores).
    model_id: the model's name in the fingerprint (default SGLang's model name).
    write_through: puts also reach the persistent tiers below (default on).
    verify: reads check every section checksum in the cache too (decoding
        checks them always).
    """

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> "BackendConfig":
        if not int(extra.get("interface_v1", 0)):
            raise _refuse("interface_v1 is off",
                          'kvtier serves the zero-copy page interface only: add "interface_v1": 1 '
                          "to --hicache-storage-backend-extra-config")
        return cls(**options_from(extra, "", _refuse, 'the extra config needs "tiers", e.g. '
                                  '"nvme:/var/cache/kvtier/r{rank}:1TiB"'))

    def rank_tiers(self, cfg: HiCacheStorageConfig) -> str:
        """The tier spec of one rank, placeholders replaced; the parent
        directories of its nvme tiers are made."""
        dp_rank = int(getattr(cfg, "dp_rank", 0) or 0)
        cp_rank, cp_size = int(cfg.attn_cp_rank or 0), int(cfg.attn_cp_size or 1)
        parts = [p for p in self.tiers.split(";") if p]
        for part in parts:  # each nvme tier must be one process's
            if not part.startswith("nvme:"):
                continue
            for size, names in ((cfg.tp_size, ("{rank}",)), (cp_size, ("{rank}", "{cp_rank}")),
                                (cfg.pp_size, ("{pp_rank}",))):
                if size > 1 and not any(n in part for n in names):
                    raise _refuse("one nvme directory for several ranks",
                                  f"each of the {size} ranks owns its nvme directory: put "
                                  f'"{names[0]}" in its path, e.g. '
                                  f'"nvme:/var/cache/kvtier/r{names[0]}:1TiB"')
        rank = str(cfg.tp_rank)
        if dp_rank:
            rank += f"-dp{dp_rank}"
        if cp_size > 1:
            rank += f"-cp{cp_rank}"
        spec = (self.tiers.replace("{rank}", rank).replace("{tp_size}", str(cfg.tp_size))
                .replace("{pp_rank}", str(cfg.pp_rank)).replace("{dp_rank}", str(dp_rank))
                .replace("{cp_rank}", str(cp_rank)))
        for part in spec.split(";"):
            if part.startswith("nvme:"):
                directory = part[len("nvme:"):].split(":", 1)[0]
                parent = os.path.dirname(directory.rstrip("/"))
                if parent:
                    os.makedirs(parent, exist_ok=True)
        return spec


# Element strides (layer, token, head) of one page's K or V inside SGLang's
# MHA host pool, by layout (pool_host/mha.py, init_kv_buffer); head_dim is
# contiguous in all of them. layer_first's layer stride spans the whole pool.
_LAYOUTS = {
    "layer_first": lambda g: (g.pool_tokens * g.heads * g.head_dim, g.heads * g.head_dim,
                              g.head_dim),
    "page_first": lambda g: (g.heads * g.head_dim, g.layers * g.heads * g.head_dim, g.head_dim),
    "page_first_direct": lambda g: (g.page_size * g.heads * g.head_dim, g.heads * g.head_dim,
                                    g.head_dim),
    "page_head": lambda g: (g.head_dim, g.layers * g.head_dim,
                            g.page_size * g.layers * g.head_dim),
}


@dataclass(frozen=True)
class PageGeometry:
    """One rank's host pool as kvtier reads its pages."""

    layout: str
    layers: int
    page_size: int
    heads: int
    head_dim: int
    dtype: int  # DTYPE_BF16 or DTYPE_F16
    pool_tokens: int  # token slots of the host pool (layer_first's layer stride)
    start_layer: int

    @property
    def itemsize(self) -> int:
        return 2

    @property
    def strides(self) -> Tuple[int, int, int]:
        return _LAYOUTS[self.layout](self)

    @property
    def ptrs_per_page(self) -> int:
        return 2 * self.layers if self.layout == "layer_first" else 2

    @property
    def meta_bytes(self) -> int:
        """The byte size get_page_buffer_meta gives each pointer."""
        per_layer = self.page_size * self.heads * self.head_dim * self.itemsize
        return per_layer if self.layout == "layer_first" else per_layer * self.layers

    def views(self, ptrs: Sequence[int], sizes: Sequence[int]) -> List[Tuple[Tensor, Tensor]]:
        """K and V of each page, from get_page_buffer_meta's lists. Raises
        Refused when they do not have the shape this layout gives them."""
        per = self.ptrs_per_page
        if len(ptrs) % per or len(sizes) != len(ptrs) or any(s != self.meta_bytes for s in sizes):
            raise _refuse("host pool", f"get_page_buffer_meta gave {len(ptrs)} pointers of sizes "
                          f"{sorted(set(sizes))}; layout {self.layout} has {per} per page of "
                          f"{self.meta_bytes} bytes")
        shape = (self.layers, self.page_size, self.heads, self.head_dim)
        strides = self.strides
        if self.layout == "layer_first" and self.layers > 1:
            step = ptrs[2] - ptrs[0]
            if step != strides[0] * self.itemsize:
                raise _refuse("host pool", f"layer_first layers are {step} bytes apart, "
                              f"expected {strides[0] * self.itemsize}")
        return [(Tensor(ptrs[i], shape, strides, self.dtype, True, None),
                 Tensor(ptrs[i + 1], shape, strides, self.dtype, True, None))
                for i in range(0, len(ptrs), per)]


def page_geometry(host: Any, cfg: HiCacheStorageConfig) -> PageGeometry:
    """The geometry of SGLang's host pool, or Refused naming what kvtier
    cannot store: MLA and K-only pools, V heads of another size than K,
    dtypes other than bf16/fp16, the page_unified layout."""
    if cfg.is_mla_model:
        raise _refuse("MLA model", "latent (MLA) caches are not supported; kvtier's codecs take "
                      "K and V of equal head sizes. Use another --hicache-storage-backend")
    kind = type(host).__name__
    layout = getattr(host, "layout", None)
    if not hasattr(host, "v_head_dim") or not hasattr(host, "kv_buffer"):
        raise _refuse(kind, "only MHA host pools with K and V (MHATokenToKVPoolHost) are "
                      "supported")
    if host.v_head_dim != host.head_dim:
        raise _refuse("head sizes", f"K head size {host.head_dim} != V {host.v_head_dim}")
    dtypes = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16}
    if host.dtype not in dtypes:
        raise _refuse(f"KV cache dtype {host.dtype}", "only bf16 and fp16 caches are supported; "
                      "kvtier's codecs compress 16-bit K/V themselves")
    if layout not in _LAYOUTS:
        raise _refuse(f"host layout {layout}", f"supported: {', '.join(_LAYOUTS)} "
                      "(--hicache-mem-layout)")
    if host.kv_buffer.device.type != "cpu":
        raise _refuse("host pool", f"on {host.kv_buffer.device}; the CPU codec reads host memory")
    return PageGeometry(layout=layout, layers=int(host.layer_num), page_size=int(host.page_size),
                        heads=int(host.head_num), head_dim=int(host.head_dim),
                        dtype=dtypes[host.dtype], pool_tokens=int(host.size),
                        start_layer=int(getattr(host, "start_layer", 0) or 0))


def page_key(fp: Key, sglang_key: str, page_size: int) -> Key:
    """The kvtier key of one SGLang page. SGLang's key is the SHA-256 chain of
    every token up to the page's end and the request's namespace (extra_key,
    cache_salt; sglang/srt/mem_cache/utils.py get_storage_hash_str); its bytes
    go through kvt_chunk_key() as 32-bit words with the page size, under the
    rank's fingerprint."""
    try:
        raw = bytes.fromhex(sglang_key)
    except ValueError:
        raw = sglang_key.encode()
    raw += page_size.to_bytes(4, "little")
    raw += b"\0" * (-len(raw) % 4)
    return chunk_key(fp, np.frombuffer(raw, dtype="<u4"))


_ALIGN = 4096
_READ_AHEAD = 16  # payloads one thread reads together (its buffer holds as many)


class _Local(threading.local):
    buf: Optional[np.ndarray] = None


class KvtierHiCacheStorage(HiCacheStorage):
    """SGLang's HiCacheStorage over a kvtier cache, with the zero-copy v1
    page interface (batch_get_v1, batch_set_v1, batch_exists). SGLang builds
    it as backend_class(storage_config, kwargs) (storage/backend_factory.py)
    and then registers its host pool; the cache opens then, when the pool's
    shape gives the fingerprint."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        self.storage_config = storage_config
        self.config = BackendConfig.from_extra(storage_config.extra_config or {})
        if storage_config.is_mla_model:
            page_geometry(None, storage_config)  # raises
        self.tiers = self.config.rank_tiers(storage_config)
        self.cache: Optional[Cache] = None
        self.geometry: Optional[PageGeometry] = None
        self.fingerprint: Optional[Key] = None
        self._bound = self._slot = 0
        self._lending = True
        self._local = _Local()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()  # SGLang's prefetch and backup threads

    # --- setup -------------------------------------------------------------------

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A hybrid model's extra pool (Mamba state, sliding-window, DSA
        indexer: SGLang's HybridCacheController registers them here): not
        stored by kvtier, refused at attach rather than failing later in
        batch_get_v2 / batch_set_v2."""
        raise _refuse(f"host pool {host_pool_name!r} ({type(host_pool).__name__})",
                      "hybrid models' extra pools (Mamba state, sliding window, DSA indexer) "
                      "are not supported: kvtier stores the K/V pages of MHA models only. Use "
                      "another --hicache-storage-backend")

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        g = page_geometry(mem_pool_host, self.storage_config)
        cfg = self.storage_config
        model = self.config.model_id or cfg.model_name or ""
        if not model:
            raise _refuse("no model name", 'SGLang gave none: set "model_id" in the extra config')
        if cfg.pp_size > 1:  # stages of equal layer counts must not share keys
            model = f"{model}#pp{cfg.pp_rank}/{cfg.pp_size}"
        if (cfg.attn_cp_size or 1) > 1:  # each context-parallel rank holds its slice
            model = f"{model}#cp{cfg.attn_cp_rank}/{cfg.attn_cp_size}"
        dtype = "bf16" if g.dtype == DTYPE_BF16 else "fp16"
        desc = ModelDesc(model, layers=g.layers, kv_heads=g.heads, head_dim=g.head_dim,
                         dtype=dtype, tp_rank=cfg.tp_rank, tp_size=cfg.tp_size)
        fp = fingerprint(desc, self.config.codec)
        cache = Cache(self.tiers, fingerprint=fp, chunk_tokens=g.page_size,
                      write_through=self.config.write_through, verify=self.config.verify)
        if self.cache is not None:
            self.cache.close()
        self.cache, self.geometry, self.fingerprint = cache, g, fp
        self._bound = encode_bound(self.config.codec, g.layers, g.page_size, g.heads, g.head_dim,
                                   layer_begin=g.start_layer)
        self._slot = -(-self._bound // _ALIGN) * _ALIGN
        self._lending = True
        log.info("kvtier.sglang: rank %d/%d, %s pool %s, codec %s, tiers %s", cfg.tp_rank,
                 cfg.tp_size, g.layout, (g.layers, g.page_size, g.heads, g.head_dim),
                 self.config.codec, self.tiers)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def _ready(self) -> Tuple[Cache, PageGeometry, Key]:
        if self.cache is None or self.geometry is None or self.fingerprint is None:
            raise RuntimeError("kvtier.sglang: no host pool registered (register_mem_pool_host)")
        return self.cache, self.geometry, self.fingerprint

    def keys_of(self, keys: Sequence[str]) -> List[Key]:
        """kvtier keys of SGLang page keys."""
        _, g, fp = self._ready()
        return [page_key(fp, k, g.page_size) for k in keys]

    # --- the v1 page interface ---------------------------------------------------

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading pages of keys are held (SGLang's hit prefix)."""
        cache, _, _ = self._ready()
        if not keys:
            return 0
        try:
            return cache.lookup_keys(self.keys_of(keys))
        except Error as e:  # a tier that cannot answer: nothing is a hit
            log.warning("kvtier.sglang: lookup of %d pages failed: %s", len(keys), e)
            return 0

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Encodes each page from the host pool and stores it; one result per key."""
        cache, g, _ = self._ready()
        views = self._views(keys, host_indices)
        kv_keys = self.keys_of(keys)
        prefix = extra_info.prefix_keys if extra_info is not None else None
        first_prev = self.keys_of(prefix[-1:])[0] if prefix else None
        prevs = [first_prev, *kv_keys[:-1]]
        return self._run(lambda i: self._set_page(cache, kv_keys[i], prevs[i], views[i]),
                         len(keys))

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Reads and decodes each page into the host pool; False for a miss or
        a payload refused by its checks (then deleted)."""
        cache, _, _ = self._ready()
        views = self._views(keys, host_indices)
        kv_keys = self.keys_of(keys)
        return self._run_spans(
            lambda span: self._get_span(cache, [kv_keys[i] for i in span],
                                        [views[i] for i in span]), len(keys))

    def _views(self, keys: Sequence[str], host_indices: torch.Tensor) -> List[Tuple[Tensor, Tensor]]:
        _, g, _ = self._ready()
        if host_indices.numel() != len(keys) * g.page_size:
            raise ValueError(f"kvtier.sglang: {host_indices.numel()} host indices for "
                             f"{len(keys)} pages of {g.page_size} tokens")
        if not keys:
            return []
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        return g.views(ptrs, sizes)

    def _run(self, fn: Callable[[int], bool], n: int) -> List[bool]:
        """fn(i) for each page, on the backend's threads where pages are many."""
        return self._run_spans(lambda span: [fn(i) for i in span], n)

    def _run_spans(self, fn: Callable[[range], List[bool]], n: int) -> List[bool]:
        """fn(span) over consecutive spans of the n pages, one per thread."""
        threads = self.config.threads
        if threads == 1 or n < 4:
            return fn(range(n))
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kvtier-sglang")
        step = max(1, -(-n // threads))
        spans = [range(s, min(s + step, n)) for s in range(0, n, step)]
        return [ok for part in self._pool.map(fn, spans) for ok in part]

    def _buffer(self, slots: int = 1) -> np.ndarray:
        """This thread's buffer of `slots` payloads, each at a 4096-aligned
        offset of _slot bytes (aligned buffers let the nvme tier read into
        them directly)."""
        need = slots * self._slot + _ALIGN
        buf = self._local.buf
        if buf is None or buf.size < need:
            buf = self._local.buf = np.empty(need, np.uint8)
        return buf[-buf.ctypes.data % _ALIGN:][:slots * self._slot]

    def _set_page(self, cache: Cache, key: Key, prev: Optional[Key],
                  kv: Tuple[Tensor, Tensor]) -> bool:
        _, g, fp = self._ready()
        try:
            if cache.query(key) is not None:
                return True  # held already
            # Chained to prev only if it is held: the pages of a batch are
            # stored on several threads, and a page stored before its prev
            # would be an orphan, which never evicts anything to make room
            # (a full tier would refuse it). A root is evicted like any page.
            if prev is not None and cache.query(prev) is None:
                prev = None
            buf = self._buffer()
            n = encode_into(buf, kv[0], kv[1], self.config.codec, key=key, fingerprint=fp,
                            layer_begin=g.start_layer, model_layers=g.start_layer + g.layers)
            cache.put(key, buf[:n], prev=prev)
            return True
        except Error as e:
            if e.code == -errno.ENOSPC:
                log.info("kvtier.sglang: no room for page %s: %s", key, e)
            else:
                log.warning("kvtier.sglang: store of page %s failed: %s", key, e)
            return False

    def _get_span(self, cache: Cache, keys: List[Key],
                  views: List[Tuple[Tensor, Tensor]]) -> List[bool]:
        """Pages lent in place by a memory tier are decoded from there; the
        others are read together (kvt_cache_get_many: the nvme tier keeps
        them in flight at once) into this thread's buffer, then decoded."""
        ok = [False] * len(keys)
        rest = list(range(len(keys)))
        if self._lending:
            rest = [i for i in rest if not self._get_lent(cache, keys[i], views[i], ok, i)]
        for c in range(0, len(rest), _READ_AHEAD):
            part = rest[c:c + _READ_AHEAD]
            buf = self._buffer(len(part))
            slots = [buf[j * self._slot:(j + 1) * self._slot] for j in range(len(part))]
            try:
                got = cache.get_many_into([keys[i] for i in part], slots)
            except Error as e:
                log.warning("kvtier.sglang: read of %d pages failed: %s", len(part), e)
                continue
            for j, i in enumerate(part):
                if got[j].code == 0:
                    fault = self._decode(keys[i], slots[j][:got[j].length], views[i])
                    ok[i] = fault is None
                    if fault in PAYLOAD_FAULTS:
                        self._drop(cache, keys[i])
                elif got[j].code != ErrorCode.ENOTFOUND:
                    log.warning("kvtier.sglang: page %s is a miss: %s", keys[i],
                                Error(got[j].code, detail="get"))
        return ok

    def _get_lent(self, cache: Cache, key: Key, kv: Tuple[Tensor, Tensor], ok: List[bool],
                  i: int) -> bool:
        """Decodes key's payload from the memory tier lending it; False where
        no tier lends it (then it is read with the others)."""
        loan, miss, lends = borrow_lent(cache, key)
        if not lends:
            self._lending = False  # the only tier cannot lend (nvme, remote)
        if miss is not None:
            log.warning("kvtier.sglang: page %s is a miss: %s", key, miss)
            return True
        if loan is None:  # a miss here; a shared tier may have it
            return False
        with loan:  # a delete of the key waits for the loan: drop after it
            fault = self._decode(key, loan.array, kv)
        ok[i] = fault is None
        if fault in PAYLOAD_FAULTS:
            self._drop(cache, key)
        return True

    def _decode(self, key: Key, payload: np.ndarray, kv: Tuple[Tensor, Tensor]) -> Optional[int]:
        """Decodes payload into the page; None, or the code refusing it."""
        try:
            decode(payload, kv[0], kv[1], expect_key=key, expect_fingerprint=self.fingerprint)
            return None
        except Error as e:
            log.warning("kvtier.sglang: page %s is a miss: %s", key, e)
            return e.code

    def _drop(self, cache: Cache, key: Key) -> None:
        try:
            cache.delete(key)
        except Error as e:
            log.warning("kvtier.sglang: could not delete refused page %s: %s", key, e)

    # --- SGLang's other methods --------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def clear(self) -> None:
        """SGLang calls this on /flush_cache. kvtier's cache has no bulk
        delete, so the payloads stay: each is keyed by model, rank and codec and
        checked on every read, so none is ever served for another page."""
        log.info("kvtier.sglang: clear() keeps the tiers' payloads (README, SGLang)")

    def get_stats(self) -> Any:
        """None: SGLang's metrics want its own StorageMetrics, which it makes
        when a backend gives none (kvtier's counters: kvtier_stats())."""
        return None

    def kvtier_stats(self) -> Any:
        """kvtier's cache counters (kvtier.CacheStats), or None before a pool
        is registered."""
        return self.cache.stats() if self.cache is not None else None

    # The tensor-copying methods SGLang uses without interface_v1; __init__
    # refuses that configuration, so they are never reached from SGLang.
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        raise _refuse("get()", 'serves the zero-copy interface only ("interface_v1": 1)')

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> Any:
        raise _refuse("batch_get()", 'serves the zero-copy interface only ("interface_v1": 1)')

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        raise _refuse("set()", 'serves the zero-copy interface only ("interface_v1": 1)')

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        raise _refuse("batch_set()", 'serves the zero-copy interface only ("interface_v1": 1)')
