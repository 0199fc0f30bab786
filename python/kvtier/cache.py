"""The cache: payloads under chunk keys across an ordered list of tiers
(kvtier/cache.h). Every method but close() may be called from many threads
at once; each call releases the GIL while the library works."""

from __future__ import annotations

import ctypes
import errno
import logging
import threading
import weakref
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _structs as S
from ._buffers import Buffer, TokenIds, read_buffer, token_array, u32_ptr, write_buffer
from ._context import Context
from ._loader import lib
from .errors import Error, ErrorCode
from .keys import Key, KeyLike

WRITE_THROUGH, NO_PROMOTE, VERIFY, BACKGROUND = 1, 2, 4, 8  # enum kvt_cache_flags

TIER_DEVICE = 1 << 2  # KVT_TIER_DEVICE: a tier whose lent bytes are GPU memory

log = logging.getLogger("kvtier")


@dataclass(frozen=True)
class CacheStats:
    """kvt_cache_stats, for one tier or the whole cache (see kvtier/cache.h)."""

    capacity: int
    used: int
    items: int
    hits: int
    misses: int
    puts: int
    bytes_in: int
    bytes_out: int
    demotions: int
    promotions: int
    evictions: int
    errors: int
    gets: int
    refused: int
    duplicates: int
    lookups: int
    lookup_hit_tokens: int
    pinned: int


@dataclass(frozen=True)
class RestorePlan:
    """kvt_cache_plan: whether loading a cached prefix beats recomputing it."""

    cached_tokens: int
    tier_bytes: Tuple[int, ...]  # payload bytes by the hottest tier holding each chunk
    link_GBps: Tuple[float, ...]
    restore_s: float
    recompute_s: float  # 0 without a model
    restore_pays: bool


class GetResult(NamedTuple):
    """One request of Cache.get_many_into(): the payload's length (also when
    the buffer was too small), the tier that served it (-1: none), and the C
    result (0, KVT_ENOTFOUND, KVT_ENOBUFS, a parse error, ...)."""

    length: int
    tier: int
    code: int

    @property
    def ok(self) -> bool:
        return self.code == 0


class _Handle:
    """The kvt_cache and its context. close() stops new calls at once; the
    C cache is closed when the last call in flight has returned and the last
    loan (Cache.borrow) is back, so a lent array never outlives its tier."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ptr = ctypes.c_void_p()
        self.cv = threading.Condition()
        self.busy = 0
        self.closed = False
        self.loans: Dict[int, S.kvt_cache_loan] = {}
        self.reservations: Dict[int, S.kvt_cache_reservation] = {}
        self.arrays = 0  # Reservation arrays alive: they point into a tier

    def enter(self) -> ctypes.c_void_p:
        with self.cv:
            if self.closed or not self.ptr:
                raise ValueError("kvtier: the cache is closed")
            self.busy += 1
        return self.ptr

    def leave(self) -> None:
        with self.cv:
            self.busy -= 1
            self._finish()

    def give_back(self, loan: S.kvt_cache_loan) -> None:
        with self.cv:
            if self.loans.pop(id(loan), None) is not None and self.ptr:
                lib.kvt_cache_return(self.ptr, ctypes.byref(loan))
            self._finish()

    def end_reservation(self, res: S.kvt_cache_reservation, publish: bool) -> int:
        """Publishes or aborts res (once); returns kvt_cache_publish's code."""
        with self.cv:
            if self.reservations.pop(id(res), None) is None or not self.ptr:
                return -errno.EINVAL
            ptr = self.ptr
            self.busy += 1  # the C cache stays open for this call
        rc = 0
        try:
            if publish:
                self.ctx.clear_logged()
                rc = lib.kvt_cache_publish(ptr, ctypes.byref(res))
            else:
                lib.kvt_cache_abort(ptr, ctypes.byref(res))
        finally:
            self.leave()
        return int(rc)

    def array_gone(self, res: S.kvt_cache_reservation) -> None:
        """A Reservation's array was collected: aborts the reservation if it
        is still open, and lets the cache close if it waited for it."""
        self.end_reservation(res, False)
        with self.cv:
            self.arrays -= 1
            self._finish()

    def close(self) -> None:
        with self.cv:
            if not self.closed and (self.loans or self.reservations):
                log.warning("kvtier: cache closed with %d loans and %d reservations out: its "
                            "tiers close once they are ended", len(self.loans),
                            len(self.reservations))
            self.closed = True
            self._finish()

    def _finish(self) -> None:
        """Closes the C cache once closed, idle and with no loan out (cv held)."""
        if self.closed and self.busy == 0 and not self.loans and not self.reservations \
                and not self.arrays and self.ptr:
            ptr, self.ptr = self.ptr, ctypes.c_void_p()
            lib.kvt_cache_close(ptr)
            self.ctx.close()
        elif self.closed and not self.ptr and self.busy == 0:
            self.ctx.close()  # never opened: the context alone


def _k(key: KeyLike) -> S.kvt_key:
    return Key(key).struct


class Loan:
    """A payload lent in place by the tier holding it (Cache.borrow): `array`
    is a read-only uint8 view of the tier's own bytes (host memory of a dram
    tier, page-locked and mapped for the GPU when the tier pins its slabs).
    An hbm tier lends GPU memory: then `device` is True, `array` is None and
    `address` is the device pointer.
    The payload is neither moved nor freed while lent. close() (or the end of
    a with block) gives it back; after that the array must not be read. A
    loan nobody closed is given back once neither it nor its array is
    referenced. A cache closed with loans out closes its tiers only once
    they are all back (with a warning)."""

    def __init__(self, handle: _Handle, loan: S.kvt_cache_loan, key: Key, device: bool) -> None:
        self.key = key
        self.tier = int(loan.tier)
        self.device = device  # GPU memory (an hbm tier): `array` is None, use `address`
        self._len = int(loan.len)
        self._addr = int(loan.data or 0)
        if device:
            self.array: Optional[np.ndarray] = None
            self._finalizer = weakref.finalize(self, handle.give_back, loan)
            return
        # The finalizer hangs on the ctypes array under the numpy view, so the
        # loan goes back once neither this object nor its array is referenced;
        # the view is of a read-only memoryview, so it cannot be made writable.
        raw = (ctypes.c_uint8 * self._len).from_address(self._addr) if self._len else \
            (ctypes.c_uint8 * 1)()
        self.array = np.frombuffer(memoryview(raw).toreadonly(), np.uint8)[:self._len]
        self._finalizer = weakref.finalize(raw, handle.give_back, loan)

    @property
    def address(self) -> int:
        """The payload's address (0 for an empty one)."""
        return self._addr

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        """Gives the payload back to its tier (idempotent)."""
        self.array = None if self.device else np.zeros(0, np.uint8)
        self._finalizer()

    def __enter__(self) -> "Loan":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Reservation:
    """Room for one payload in the cache's hottest tier (Cache.reserve):
    `array` is a writable uint8 view of len bytes (host memory of a dram
    tier, page-locked and mapped for the GPU when the tier pins its slabs).
    Write the payload there, then publish(); abort() (or leaving a with
    block without publishing) gives the room back. A reservation nobody
    ended is aborted once neither it nor its array is referenced. The array
    must not be written after publish(): the bytes are the key's value."""

    def __init__(self, handle: _Handle, res: S.kvt_cache_reservation, key: Key) -> None:
        self.key = key
        self._h = handle
        self._res = res
        self._len = int(res.len)
        raw = (ctypes.c_uint8 * self._len).from_address(int(res.data))
        self.array: Optional[np.ndarray] = np.ctypeslib.as_array(raw)
        # Until the array is collected the cache stays open (its block is
        # tier memory); an unended reservation is then aborted.
        with handle.cv:
            handle.arrays += 1
        weakref.finalize(raw, handle.array_gone, res)

    def __len__(self) -> int:
        return self._len

    def publish(self) -> None:
        """Makes the bytes written the value of key (after the header checks
        of a put, and written through as a put is). Raises Error (a failed
        check: the reservation is aborted) or ValueError (already ended)."""
        rc = self._h.end_reservation(self._res, True)  # before the array may go
        if self.array is not None:
            self.array.flags.writeable = False  # the tier's value now
        self.array = None
        if rc == -errno.EINVAL:
            raise ValueError("kvtier: the reservation was already published or aborted")
        if rc:
            detail = self._h.ctx.logged()
            raise Error(rc, detail=f"publish {self.key}: {detail}" if detail
                        else f"publish {self.key}")

    def abort(self) -> None:
        """Gives the room back; nothing is stored (idempotent; nothing to do
        after publish())."""
        self.array = None
        self._h.end_reservation(self._res, False)

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.abort()  # after publish() this does nothing


class Cache:
    """A kvtier cache over tiers given as one spec string, hottest first:
    Cache("dram:8GiB;nvme:/var/cache/kvtier:1TiB") (grammar: docs/TIERS.md).

    fingerprint: the model fingerprint of every payload held (puts of another
        model's payloads are refused, KVT_EFOREIGN); needed by lookup().
    chunk_tokens: tokens per chunk for lookup() (the chunk size of the keys).
    write_through: puts also go to the persistent tiers below (nvme).
    promote: hits in lower tiers are copied up to the top tier.
    verify: gets check every section checksum (else the header, and tiers
        whose bytes leave the process check a whole-payload hash).
    background: a thread of the cache demotes ahead of need, keeping
        headroom_pct % of each upper tier free.
    links: per tier, a link preset or GB/s for plan_restore().

    Use as a context manager, or call close().
    Raises Error from kvt_cache_open (a bad spec: -EINVAL or KVT_ESPEC).
    """

    def __init__(self, tiers: str, *, fingerprint: Optional[KeyLike] = None,
                 chunk_tokens: int = 256, write_through: bool = False, promote: bool = True,
                 verify: bool = False, background: bool = False, headroom_pct: int = 0,
                 links: Union[str, Sequence[str], None] = None) -> None:
        self._h = _Handle(Context(log=True))
        cfg = S.init(S.kvt_cache_config)
        cfg.tiers = tiers.encode()
        fp = None
        if fingerprint is not None:
            fp = _k(fingerprint)
            cfg.fingerprint = ctypes.pointer(fp)
        cfg.chunk_tokens = chunk_tokens
        cfg.flags = ((WRITE_THROUGH if write_through else 0) | (0 if promote else NO_PROMOTE)
                     | (VERIFY if verify else 0) | (BACKGROUND if background else 0))
        cfg.headroom_pct = headroom_pct
        if links is not None:
            cfg.links = (links if isinstance(links, str) else ";".join(links)).encode()
        try:
            self._h.ctx.call(lib.kvt_cache_open, ctypes.byref(cfg), ctypes.byref(self._h.ptr))
        except BaseException:
            self._h.ctx.close()
            raise
        self._fingerprint = Key(fingerprint) if fingerprint is not None else None
        self._finalizer = weakref.finalize(self, self._h.close)
        self._check_stats_size()

    # --- plumbing ----------------------------------------------------------

    def _call(self, fn: Callable[..., int], *args: Any) -> int:
        """fn(cache, *args) with the GIL released; returns its code."""
        ptr = self._h.enter()
        try:
            self._h.ctx.clear_logged()
            return fn(ptr, *args)
        finally:
            self._h.leave()

    def _raise(self, rc: int, what: str) -> None:
        # Data-path calls leave no detail in the context; the line they logged is it.
        detail = self._h.ctx.logged()
        raise Error(rc, detail=f"{what}: {detail}" if detail else what)

    def _check_stats_size(self) -> None:
        buf = (ctypes.c_uint8 * 1024)()  # struct_size 0: the library fills its whole struct
        self._call(lib.kvt_cache_stats_get, -1, buf)
        size = ctypes.c_size_t.from_buffer(buf).value
        if size != ctypes.sizeof(S.kvt_cache_stats):
            self.close()
            raise RuntimeError(f"kvtier: kvt_cache_stats is {size} bytes in the library, "
                              f"{ctypes.sizeof(S.kvt_cache_stats)} in this binding")

    # --- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Closes the cache: calls after this raise ValueError. The tiers
        close at once, or, when calls are in flight on other threads or loans
        are out, as soon as the last of them ends. Idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- data path -------------------------------------------------------------

    def put(self, key: KeyLike, payload: Buffer, prev: Optional[KeyLike] = None) -> None:
        """Stores payload under key (copied before this returns); prev is the
        previous chunk's key, for prefix-aware eviction. A key already held is
        not written again. Raises Error: KVT_EFOREIGN (the header's key or
        fingerprint differ), a parse error (KVT_EFORMAT, KVT_ECHECKSUM, ...),
        -ENOSPC (no tier can take it), or a tier's error."""
        k = _k(key)
        p = _k(prev) if prev is not None else None
        addr, n, keep = read_buffer(payload)
        rc = self._call(lib.kvt_cache_put, ctypes.byref(k), ctypes.byref(p) if p is not None else None,
                        addr, n)
        del keep
        if rc:
            self._raise(rc, f"put {Key(key)}")

    def get_into(self, key: KeyLike, buf: Buffer) -> Optional[int]:
        """Copies the payload under key into the writable buffer buf; returns
        its length, or None on a miss. Raises Error: KVT_ENOBUFS (detail says
        the length), KVT_EFOREIGN or a parse error (the payload was refused
        and deleted), or a tier's error."""
        k = _k(key)
        addr, cap, keep = write_buffer(buf)
        n, tier = ctypes.c_uint64(), ctypes.c_int(-1)
        rc = self._call(lib.kvt_cache_get, ctypes.byref(k), addr, cap, ctypes.byref(n),
                        ctypes.byref(tier))
        del keep
        if rc == ErrorCode.ENOTFOUND:
            return None
        if rc == ErrorCode.ENOBUFS:
            self._raise(rc, f"get {Key(key)}: payload is {n.value} bytes, buffer {cap}")
        if rc:
            self._raise(rc, f"get {Key(key)}")
        return int(n.value)

    def get(self, key: KeyLike) -> Optional[bytes]:
        """The payload under key, or None on a miss. Raises Error as get_into()."""
        hint = self.query(key)
        buf = bytearray(hint[0] if hint else 0)
        try:
            n = self.get_into(key, buf)
        except Error as e:
            if e.code != ErrorCode.ENOBUFS:
                raise
            size = self.query(key)  # held elsewhere (a shared tier): now indexed
            buf = bytearray(size[0] if size else 0)
            n = self.get_into(key, buf)
        return None if n is None else bytes(memoryview(buf)[:n])

    def borrow(self, key: KeyLike) -> Optional[Loan]:
        """The payload under key lent in place by its hottest tier, without a
        copy (kvt_cache_borrow), or None on a miss. Header checks as a get
        (every section checksum too when the cache verifies). No promotion.
        While the loan is out, eviction passes the payload over and a delete
        of the key waits: give the loan back before deleting the key in the
        same thread.

        Raises Error: KVT_ENOTSUP (the hottest tier holding it cannot lend:
        nvme, remote tiers; use get_into), EAGAIN (too many loans out at
        once), KVT_EFOREIGN or a parse error (refused and deleted, as a get)."""
        k = _k(key)
        loan = S.init(S.kvt_cache_loan)
        h = self._h
        ptr = h.enter()  # close() waits for this call, and then finds the loan
        try:
            h.ctx.clear_logged()
            rc = lib.kvt_cache_borrow(ptr, ctypes.byref(k), ctypes.byref(loan))
            if rc == 0:
                with h.cv:
                    h.loans[id(loan)] = loan
        finally:
            h.leave()
        if rc == ErrorCode.ENOTFOUND:
            return None
        if rc == -errno.EAGAIN:
            self._raise(rc, f"borrow {Key(key)}: too many loans out at once (return some, "
                        "or copy with get_into)")
        if rc:
            self._raise(rc, f"borrow {Key(key)}")
        tier = self._call(lib.kvt_cache_tier, int(loan.tier))
        device = bool(lib.kvt_tier_traits(tier) & TIER_DEVICE)
        return Loan(h, loan, Key(key), device)

    def reserve(self, key: KeyLike, length: int,
                prev: Optional[KeyLike] = None) -> Optional[Reservation]:
        """Room for key's payload of `length` bytes in the hottest tier, to
        be written in place (a GPU store kernel writes straight into it) and
        published: a put without the copy (kvt_cache_reserve). prev as for
        put(). Returns None when key is held already (nothing reserved).
        Until the reservation ends, a put or reserve of the same key waits
        for it: in one thread, publish or abort first.
        Raises Error: KVT_ENOTSUP (the hottest tier cannot reserve: nvme,
        remote or hbm tiers; use put), -ENOSPC."""
        k = _k(key)
        p = _k(prev) if prev is not None else None
        res = S.init(S.kvt_cache_reservation)
        h = self._h
        ptr = h.enter()
        try:
            h.ctx.clear_logged()
            rc = lib.kvt_cache_reserve(ptr, ctypes.byref(k),
                                       ctypes.byref(p) if p is not None else None,
                                       int(length), ctypes.byref(res))
            if rc == 0:
                with h.cv:
                    h.reservations[id(res)] = res
        finally:
            h.leave()
        if rc == -errno.EEXIST:
            return None
        if rc:
            self._raise(rc, f"reserve {Key(key)} ({length} bytes)")
        return Reservation(h, res, Key(key))

    def get_many_into(self, keys: Sequence[KeyLike], buffers: Sequence[Buffer], *,
                      max_in_flight: int = 0) -> List[GetResult]:
        """kvt_cache_get_many(): one result per key, reads of a tier kept in
        flight together (up to max_in_flight, 0: 32). Buffers are written in
        place (4096-aligned ones let the nvme tier skip a bounce copy)."""
        if len(keys) != len(buffers):
            raise ValueError("kvtier: get_many_into needs one buffer per key")
        reqs = (S.kvt_cache_get_req * max(len(keys), 1))()
        keep = []
        for i, (key, buf) in enumerate(zip(keys, buffers)):
            addr, cap, kb = write_buffer(buf)
            keep.append(kb)
            reqs[i].key = _k(key)
            reqs[i].buf, reqs[i].cap = addr, cap
        rc = self._call(lib.kvt_cache_get_many, reqs, len(keys), max_in_flight)
        del keep
        if rc:
            self._raise(rc, f"get_many of {len(keys)} keys")
        return [GetResult(int(reqs[i].len), int(reqs[i].tier), int(reqs[i].result))
                for i in range(len(keys))]

    def get_many(self, keys: Sequence[KeyLike], *, max_in_flight: int = 0,
                 errors: str = "raise") -> List[Optional[bytes]]:
        """The payloads under keys (None for a miss), read together.

        errors: "raise" raises Error for the first payload that failed other
        than by a miss (the cache has refused and deleted a bad one), after
        every read is done; "miss" reports such a payload as None (it is
        logged to the "kvtier" logger)."""
        if errors not in ("raise", "miss"):
            raise ValueError("kvtier: errors must be 'raise' or 'miss'")
        sizes = [self.query(k) for k in keys]
        bufs = [bytearray(s[0] if s else 0) for s in sizes]
        res = self.get_many_into(keys, bufs, max_in_flight=max_in_flight)
        out: List[Optional[bytes]] = []
        first: Optional[Error] = None
        for key, buf, r in zip(keys, bufs, res):
            if r.code == ErrorCode.ENOBUFS:  # not in the index: found in a shared tier
                buf = bytearray(r.length)
                n = self.get_into(key, buf)
                out.append(None if n is None else bytes(memoryview(buf)[:n]))
                continue
            if r.code == 0:
                out.append(bytes(memoryview(buf)[:r.length]))
                continue
            out.append(None)
            if r.code != ErrorCode.ENOTFOUND and first is None:
                first = Error(r.code, detail=f"get {Key(key)}")
        if first is not None and errors == "raise":
            raise first
        return out

    def delete(self, key: KeyLike) -> bool:
        """Removes key from every tier; False if it was not held."""
        k = _k(key)
        rc = self._call(lib.kvt_cache_del, ctypes.byref(k))
        if rc == ErrorCode.ENOTFOUND:
            return False
        if rc:
            self._raise(rc, f"delete {Key(key)}")
        return True

    # --- lookups ---------------------------------------------------------------

    def lookup(self, tokens: TokenIds) -> int:
        """How many leading tokens are cached (a multiple of chunk_tokens):
        walks the chained keys of the cache's fingerprint. Touches the hits."""
        ids = token_array(tokens)
        out = ctypes.c_size_t()
        rc = self._call(lib.kvt_cache_lookup, u32_ptr(ids), ids.size, ctypes.byref(out))
        if rc:
            self._raise(rc, "lookup (a cache opened without a fingerprint has none)")
        return int(out.value)

    def lookup_keys(self, keys: Sequence[KeyLike]) -> int:
        """How many leading keys of keys are held."""
        arr = (S.kvt_key * max(len(keys), 1))(*[_k(k) for k in keys])
        out = ctypes.c_size_t()
        rc = self._call(lib.kvt_cache_lookup_keys, arr, len(keys), ctypes.byref(out))
        if rc:
            self._raise(rc, "lookup_keys")
        return int(out.value)

    def query(self, key: KeyLike) -> Optional[Tuple[int, int]]:
        """(length, hottest tier) of the payload under key, or None; no touch,
        from the index alone."""
        k = _k(key)
        n, tier = ctypes.c_uint64(), ctypes.c_int(-1)
        rc = self._call(lib.kvt_cache_query, ctypes.byref(k), ctypes.byref(n), ctypes.byref(tier))
        if rc == ErrorCode.ENOTFOUND:
            return None
        if rc:
            self._raise(rc, "query")
        return int(n.value), int(tier.value)

    def where(self, key: KeyLike) -> List[int]:
        """Indices of the tiers holding a copy of key."""
        k = _k(key)
        mask = self._call(lib.kvt_cache_where, ctypes.byref(k))
        return [i for i in range(S.KVT_CACHE_MAX_TIERS) if mask >> i & 1]

    def __contains__(self, key: object) -> bool:
        return self.query(key) is not None  # type: ignore[arg-type]

    def plan_restore(self, tokens: TokenIds, model: Any = None, *, tflops: float = 0.0,
                     mfu: float = 0.0) -> RestorePlan:
        """Whether restoring the cached prefix of tokens beats recomputing it
        (model: a ModelArch or preset name, for the recompute estimate)."""
        from .model import model_arch

        ids = token_array(tokens)
        arch = model_arch(model).struct if model is not None else None
        out = S.init(S.kvt_cache_plan)
        rc = self._call(lib.kvt_cache_plan_restore, u32_ptr(ids), ids.size,
                        ctypes.byref(arch) if arch is not None else None, tflops, mfu,
                        ctypes.byref(out))
        if rc:
            self._raise(rc, "plan_restore")
        n = self.tier_count
        return RestorePlan(int(out.cached_tokens), tuple(out.tier_bytes[:n]),
                           tuple(out.link_GBps[:n]), out.restore_s, out.recompute_s,
                           bool(out.restore_pays))

    # --- introspection ---------------------------------------------------------

    @property
    def fingerprint(self) -> Optional[Key]:
        return self._fingerprint

    @property
    def tier_count(self) -> int:
        return int(self._call(lib.kvt_cache_tier_count))

    @property
    def tiers(self) -> List[str]:
        """Each tier's spec, hottest first."""
        out = []
        for i in range(self.tier_count):
            t = self._call(lib.kvt_cache_tier, i)
            out.append((lib.kvt_tier_spec(t) or b"").decode())
        return out

    def stats(self, tier: Optional[int] = None) -> CacheStats:
        """Counters of tier `tier`, or of the whole cache (None)."""
        s = S.init(S.kvt_cache_stats)
        rc = self._call(lib.kvt_cache_stats_get, -1 if tier is None else tier, ctypes.byref(s))
        if rc:
            self._raise(rc, f"stats of tier {tier}")
        return CacheStats(**{f.name: int(getattr(s, f.name)) for f in fields(CacheStats)})
