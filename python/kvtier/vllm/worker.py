"""The worker side of the kvtier vLLM plug-in: an OffloadingWorker
(vllm/v1/kv_offload/base.py:657 in vLLM 0.33.0) that moves chunks between the
engine's paged KV cache and this rank's kvtier cache.

A store compresses a chunk's blocks on the device into a host buffer (the
fused store kernel, codec from the config) and puts the payload into the
cache; a load borrows the payload where it lies (a dram tier lends its own
page-locked bytes, no copy; other tiers copy it into a host buffer) and has
the device decode it into the destination blocks (the fused load kernel).
submit_store/submit_load return at once: a job's chunks are spread over the
worker's transfer threads, each with its own CUDA stream and host buffer, so
one request's chunks are checked, copied and loaded in parallel. The device
work is the KVDevice's (kvtier.gpu's CUDA handle, or any object with its
methods).

A load that finds a payload missing, corrupt (checksums), foreign (another
model's fingerprint or another key) or of the wrong shape fails as a whole:
its TransferResult says success=False, names the chunks that failed and
every engine block from the first failed chunk on, and KvtierConnector
reports them so vLLM recomputes those tokens. Nothing is written from a
payload that failed its checks (the device verifies before it writes).
"""

from __future__ import annotations

import errno
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Set, Tuple

import numpy as np
from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    OffloadKey,
    TransferResult,
)

from ..cache import Cache, Loan
from ..errors import PAYLOAD_FAULTS, Error, ErrorCode
from ..keys import Key
from .config import chunk_key_of
from .manager import KvtierLoadSpec, KvtierStoreSpec

log = logging.getLogger("kvtier.vllm")


class KVDevice(Protocol):
    """What the worker needs from the device that holds the engine's KV cache.

    One object per worker, built over vLLM's per-layer KV tensors, with the
    codec and this rank's fingerprint fixed at construction. block_ids lists
    the engine blocks of one chunk in token order; -1 leaves that block out
    (a load then skips its tokens of the payload). Calls come from the
    worker's transfer threads, at most one call at a time per thread.
    """

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """A uint8 numpy array of nbytes over host memory the device reads and
        writes directly (page-locked memory for a GPU)."""
        ...

    def mark(self) -> Any:
        """A point on the engine's current stream, taken when a store is
        submitted: the store must read the blocks after the work before it."""
        ...

    def store(self, block_ids: Sequence[int], out: np.ndarray, *, key: Key, after: Any) -> int:
        """Encodes the chunk's blocks, after `after`, into out as a payload
        under key; returns its length once it is complete. Raises
        kvtier.Error (KVT_ENOBUFS when out is too small, KVT_ENONFINITE...)."""
        ...

    def payload_bytes(self, num_blocks: int) -> int:
        """The exact length of a store of num_blocks blocks (optional: with
        it, the worker has the store write straight into a block reserved in
        the cache's dram tier, Cache.reserve, instead of copying)."""
        ...

    def load(self, payload: np.ndarray, block_ids: Sequence[int], *, key: Key) -> None:
        """Checks payload (header, key, fingerprint, shape, checksums) and
        writes its tokens into the blocks; returns once they are written.
        Raises kvtier.Error, having written nothing, if a check fails."""
        ...

    # Optional: load_many(payloads, block_ids_list, *, keys) -> a list of
    # exactly one outcome per payload, None or kvtier.Error (its Error makes
    # the chunk a miss and a payload fault drops it), once every chunk is
    # written; or None having written nothing (then load() is called per
    # chunk). If it raises, every chunk of the group is failed and none is
    # dropped (the device failed, not the payloads). With it, the worker loads a job's chunks in groups of
    # LOAD_GROUP (CudaDevice: batched launches, kvt_gpu_load_batch), unless
    # the device's batch_below (bytes) is at most payload_bytes() of a chunk.


class KvtierTransferResult(TransferResult):
    """A TransferResult with what a failed job left undone."""

    def __init__(self, job_id: int, success: bool, transfer_size: Optional[int] = None,
                 transfer_time: Optional[float] = None,
                 failed_keys: Sequence[OffloadKey] = (),
                 invalid_block_ids: Sequence[int] = ()) -> None:
        super().__init__(job_id=job_id, success=success, transfer_size=transfer_size,
                         transfer_time=transfer_time)
        self.failed_keys: List[OffloadKey] = list(failed_keys)
        self.invalid_block_ids: List[int] = list(invalid_block_ids)


@dataclass
class _Local:
    """A transfer thread's host buffer, grown as payloads need."""

    buf: Optional[np.ndarray] = None


@dataclass
class _Stats:
    stores: int = 0
    loads: int = 0
    failed_loads: int = 0
    failed_stores: int = 0
    reasons: Dict[str, int] = field(default_factory=dict)


def chunk_blocks(spec: GPULoadStoreSpec, nchunks: int, blocks_per_chunk: int) -> List[List[int]]:
    """The engine blocks of each chunk, -1 where the chunk's block is not in
    the spec: a load may start inside its first chunk (block_indices[0] is
    the request's block index of block_ids[0]) and end inside its last."""
    ids = [int(b) for b in spec.block_ids]
    first = int(spec.block_indices[0]) % blocks_per_chunk if len(spec.block_indices) else 0
    padded = [-1] * first + ids
    padded += [-1] * (nchunks * blocks_per_chunk - len(padded))
    if len(padded) != nchunks * blocks_per_chunk:
        raise ValueError(f"{len(ids)} blocks from offset {first} do not fit {nchunks} chunks "
                         f"of {blocks_per_chunk} blocks")
    return [padded[i * blocks_per_chunk:(i + 1) * blocks_per_chunk] for i in range(nchunks)]


PRIO_EXPEDITED, PRIO_LOAD, PRIO_STORE, PRIO_STOP = 0, 1, 2, 3
# Chunks a transfer thread loads together (at most) when the device has
# load_many, and the loans a dram tier gives out at once (tier_dram.c).
LOAD_GROUP = 16
DRAM_LOANS = 64

class _Job:
    """One submitted job: its chunks run as separate tasks on the transfer
    threads; the last one to finish builds the job's result."""

    def __init__(self, job_id: int, n: int, finish: Callable[[List[Any]], "KvtierTransferResult"],
                 fallback: Callable[[], "KvtierTransferResult"]) -> None:
        self.job_id = job_id
        self.results: List[Any] = [None] * n
        self.remaining = n
        self.finish = finish
        self.fallback = fallback  # the result when finish itself raises (a bug)
        self.future: "Future[KvtierTransferResult]" = Future()
        self.t0 = time.perf_counter()


class KvtierWorker(OffloadingWorker):
    """OffloadingWorker over one rank's kvtier cache and KV device.

    cache: the rank's Cache (opened with the rank's fingerprint); owned.
    fingerprint: the rank's model fingerprint (kvtier.vllm.config).
    chunk_tokens, blocks_per_chunk: the offloaded chunk's size.
    threads: transfer threads; every chunk of every job is one task on them.
    """

    def __init__(self, device: KVDevice, cache: Cache, fingerprint: Key, chunk_tokens: int,
                 blocks_per_chunk: int, threads: int = 4) -> None:
        self.device = device
        self.cache = cache
        self.fingerprint = fingerprint
        self.chunk_tokens = chunk_tokens
        self.blocks_per_chunk = blocks_per_chunk
        self.stats = _Stats()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._jobs: Dict[int, _Job] = {}
        self._done: List[KvtierTransferResult] = []
        # Tasks by priority (expedited loads, loads, stores), first in first
        # out within one: a store waits for its predecessor's put, which was
        # queued before it, so it is running or done and the wait ends.
        self._queue: "queue.PriorityQueue[Tuple[int, int, Any]]" = queue.PriorityQueue()
        self._seq = itertools.count()
        self._putting: Dict[Key, threading.Event] = {}  # chunks queued or being stored
        self._closed = False
        self._reserving = True  # stores write into blocks reserved in the cache
        # Loads in groups (device.load_many) unless the device says chunks of
        # this size load faster one by one (its batch_below, in bytes).
        limit = getattr(device, "batch_below", None)
        self._groups_loads = hasattr(device, "load_many") and (
            limit is None or not hasattr(device, "payload_bytes") or
            device.payload_bytes(blocks_per_chunk) < limit)
        self._threads = [threading.Thread(target=self._serve, name=f"kvtier-vllm-{i}",
                                          daemon=True) for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def key(self, offload_key: OffloadKey) -> Key:
        return chunk_key_of(self.fingerprint, offload_key, self.chunk_tokens)

    # --- OffloadingWorker ------------------------------------------------------

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, KvtierStoreSpec), dst_spec
        blocks = chunk_blocks(src_spec, len(dst_spec.keys), self.blocks_per_chunk)
        after = self.device.mark()
        keys = [self.key(k) for k in dst_spec.keys]
        prevs = [self.key(p) if p is not None else None for p in dst_spec.prevs]
        with self._lock:
            if self._closed:
                return False
            # Each chunk is put after the chunk before it, with it as prev:
            # the cache's prefix-aware placement then never evicts a chain's
            # head for its tail. Encoding runs in parallel; only puts wait.
            # What each chunk waits for is fixed now: the chunk before it in
            # this job, or for the first one whatever stores its prev at this
            # moment (a later job storing that key again does not count).
            mine: List[threading.Event] = []
            waits: List[Optional[threading.Event]] = []
            for i, key in enumerate(keys):
                waits.append(mine[-1] if i else
                             self._putting.get(prevs[0]) if prevs[0] is not None else None)
                mine.append(threading.Event())
                self._putting[key] = mine[-1]
        tasks = [(self._store_chunk, (keys[i], prevs[i], ids, after, mine[i], waits[i]))
                 for i, ids in enumerate(blocks)]

        def finish(results: List[Any]) -> KvtierTransferResult:
            failed = [dst_spec.keys[i] for i, r in enumerate(results) if isinstance(r, Exception)]
            with self._lock:
                self.stats.stores += 1
                self.stats.failed_stores += bool(failed)
            nbytes = sum(r for r in results if isinstance(r, int))
            return KvtierTransferResult(job_id, not failed, transfer_size=nbytes,
                                        failed_keys=failed)

        def fallback() -> KvtierTransferResult:
            return KvtierTransferResult(job_id, False, failed_keys=list(dst_spec.keys))

        return self._submit(job_id, tasks, finish, fallback, PRIO_STORE)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        assert isinstance(src_spec, KvtierLoadSpec), src_spec
        blocks = chunk_blocks(dst_spec, len(src_spec.keys), self.blocks_per_chunk)
        keys = [self.key(k) for k in src_spec.keys]
        grouped = self._groups_loads and len(keys) > 1
        # Groups of at most LOAD_GROUP chunks, so that the threads' loans stay
        # within the dram tier's 64 pins and a small job still spreads over
        # every thread.
        nthreads = len(self._threads)
        group = max(1, min(LOAD_GROUP, DRAM_LOANS // nthreads, -(-len(keys) // nthreads)))
        if grouped:  # a task per group, each task's result a list
            tasks = [(self._load_group, (keys[i:i + group], blocks[i:i + group]))
                     for i in range(0, len(keys), group)]
        else:
            tasks = [(self._load_chunk, (k, ids)) for k, ids in zip(keys, blocks)]

        def finish(task_results: List[Any]) -> KvtierTransferResult:
            results: List[Any] = []
            for t, r in enumerate(task_results):
                if grouped and not isinstance(r, list):  # the group's task raised
                    r = [r] * len(keys[t * group:(t + 1) * group])
                results.extend(r if grouped else [r])
            # A chunk is loaded only if its result is its byte count.
            bad = [i for i, r in enumerate(results) if not isinstance(r, int)]
            nbytes = sum(r for r in results if isinstance(r, int))
            with self._lock:
                self.stats.loads += 1
                self.stats.failed_loads += bool(bad)
            if not bad:
                return KvtierTransferResult(job_id, True, transfer_size=nbytes)
            # vLLM recomputes from the first invalid block on: every block of
            # the first failed chunk and of all chunks after it is reported.
            invalid = [b for chunk in blocks[bad[0]:] for b in chunk if b >= 0]
            return KvtierTransferResult(job_id, False, transfer_size=nbytes,
                                        failed_keys=[src_spec.keys[i] for i in bad],
                                        invalid_block_ids=invalid)

        def fallback() -> KvtierTransferResult:
            return KvtierTransferResult(job_id, False, failed_keys=list(src_spec.keys),
                                        invalid_block_ids=[b for c in blocks for b in c if b >= 0])

        # vLLM waits for an expedited load within the step: it goes first.
        return self._submit(job_id, tasks, finish, fallback,
                            PRIO_EXPEDITED if expedited else PRIO_LOAD)

    def get_finished(self) -> List[TransferResult]:
        with self._lock:
            done, self._done = self._done, []
        return list(done)

    def wait(self, job_ids: Set[int]) -> None:
        with self._lock:
            futures = [self._jobs[j].future for j in job_ids if j in self._jobs]
        for f in futures:
            f.result()  # the job's result is queued before its future is set

    def shutdown(self) -> None:
        """Finishes the jobs submitted, stops the transfer threads and closes
        the cache. Later submits return False."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._queue.put((PRIO_STOP, next(self._seq), None))
        for t in self._threads:
            t.join()
        self.cache.close()

    # --- probes (KvtierConnector) -------------------------------------------------

    def probe(self, keys: Sequence[OffloadKey]) -> Set[OffloadKey]:
        """The keys whose payload this rank's cache holds (asking shared tiers
        about those it does not index)."""
        held = set()
        for okey in keys:
            try:
                if self.cache.lookup_keys([self.key(okey)]) == 1:
                    held.add(okey)
            except Error as e:  # a tier that cannot answer: not held
                log.warning("kvtier.vllm: probe of a chunk failed: %s", e)
        return held

    # --- jobs ----------------------------------------------------------------------

    def _submit(self, job_id: int, tasks: List[Tuple[Any, tuple]],
                finish: Callable[[List[Any]], KvtierTransferResult],
                fallback: Callable[[], KvtierTransferResult], prio: int) -> bool:
        job = _Job(job_id, len(tasks), finish, fallback)
        with self._lock:
            if self._closed:
                return False
            self._jobs[job_id] = job
            # In chunk order: a request's leading chunks start first.
            for i, (fn, args) in enumerate(tasks):
                self._queue.put((prio, next(self._seq), (job, i, fn, args)))
        if not tasks:
            self._complete(job)
        return True

    def _serve(self) -> None:
        while True:
            prio, _, item = self._queue.get()
            if prio == PRIO_STOP:
                return
            self._task(*item)

    def _task(self, job: _Job, i: int, fn: Any, args: tuple) -> None:
        try:
            r: Any = fn(*args)
        except Error as e:
            self._reason(e.name)
            r = e
        except Exception as e:  # a bug, not a payload: still report the job
            log.exception("kvtier.vllm: a chunk of job %d failed", job.job_id)
            self._reason(type(e).__name__)
            r = e
        with self._lock:
            job.results[i] = r
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            self._complete(job)

    def _complete(self, job: _Job) -> None:
        try:
            result = job.finish(job.results)
        except Exception:
            log.exception("kvtier.vllm: job %d failed", job.job_id)
            result = job.fallback()
        result.transfer_time = time.perf_counter() - job.t0
        with self._lock:
            self._done.append(result)
            self._jobs.pop(job.job_id, None)
        job.future.set_result(result)

    def _reason(self, name: str) -> None:
        with self._lock:
            self.stats.reasons[name] = self.stats.reasons.get(name, 0) + 1

    def _buffer(self, nbytes: int) -> np.ndarray:
        local: _Local = getattr(self._local, "v", None) or _Local()
        self._local.v = local
        if local.buf is None or local.buf.size < nbytes:
            size = max(nbytes, 2 * (local.buf.size if local.buf is not None else 0))
            local.buf = self.device.host_buffer(size)
        return local.buf

    # --- store -------------------------------------------------------------------

    def _store_chunk(self, key: Key, prev: Optional[Key], ids: List[int], after: Any,
                     mine: threading.Event, before: Optional[threading.Event]) -> int:
        """Stores one chunk; returns the payload's bytes (0: held already).
        mine is set once the chunk's entry is in the cache (or will not be),
        so the next chunk of the chain can be put with this one as prev."""
        try:
            if self.cache.query(key) is not None:
                return 0  # held already (another engine, or before a restart)
            if self._reserving:
                n = self._store_in_place(key, prev, ids, after, mine, before)
                if n is not None:
                    return n
            n = self._encode(ids, key, after)
            if before is not None:
                before.wait()
            self.cache.put(key, self._buffer(n)[:n], prev=prev)
            return n
        except Error as e:
            log.warning("kvtier.vllm: store of chunk %s failed: %s", key, e)
            raise
        finally:
            mine.set()
            with self._lock:
                if self._putting.get(key) is mine:
                    del self._putting[key]

    def _store_in_place(self, key: Key, prev: Optional[Key], ids: List[int], after: Any,
                        mine: threading.Event,
                        before: Optional[threading.Event]) -> Optional[int]:
        """Stores the chunk straight into a block reserved for it in the
        cache's hottest tier (no copy); None where that cannot be done (a
        tier that cannot reserve, memory the device cannot write, no room)
        and the caller stores through its host buffer."""
        bound = getattr(self.device, "payload_bytes", None)
        if bound is None:
            self._reserving = False
            return None
        n = int(bound(len(ids)))
        if before is not None:
            before.wait()
        try:
            res = self.cache.reserve(key, n, prev=prev)
        except Error as e:
            if e.code == ErrorCode.ENOTSUP:
                self._reserving = False  # the hottest tier cannot: never again
            elif e.code != -errno.ENOSPC:
                raise
            return None  # ENOSPC: a put tries the tiers below
        if res is None:
            return 0  # another engine or job stored it meanwhile
        mine.set()  # the entry exists: the next chunk may reserve behind it
        try:
            assert res.array is not None
            m = self.device.store(ids, res.array, key=key, after=after)
            if m != n:
                raise Error(ErrorCode.ESHAPE, detail=f"the device wrote {m} bytes, said {n}")
            res.publish()
            return n
        except Error as e:
            res.abort()
            if e.code == ErrorCode.ENOTSUP:  # memory the device cannot write (pageable)
                log.info("kvtier.vllm: the device cannot store into the cache's tier (%s); "
                         "storing through host buffers", e)
                self._reserving = False
                return None
            raise
        finally:
            res.abort()  # a no-op once published or aborted

    def _encode(self, ids: List[int], key: Key, after: Any) -> int:
        buf = self._buffer(1 << 20)
        while True:
            try:
                return self.device.store(ids, buf, key=key, after=after)
            except Error as e:
                if e.code != ErrorCode.ENOBUFS or buf.size >= 1 << 34:
                    raise
                buf = self._buffer(2 * buf.size)

    # --- load --------------------------------------------------------------------

    def _load_chunk(self, key: Key, ids: List[int]) -> int:
        """Loads one chunk into ids; returns the payload's bytes. Raises
        Error: the chunk is then a miss (its blocks may hold some loaded
        layers: a payload of several staged pieces whose checksums are
        verified on the GPU loads the pieces that pass), recomputed with
        every chunk after it."""
        loan: Optional[Loan] = None
        payload: Optional[np.ndarray] = None
        try:
            loan, payload = self._fetch(key)
            if payload is None:
                raise Error(ErrorCode.ENOTFOUND,
                            detail=f"get {key}: no payload (evicted, or never stored)")
            self.device.load(payload, ids, key=key)
            return len(payload)
        except Error as e:
            if loan is not None:
                loan.close()  # a delete waits for the loan
                loan = None
            if payload is not None and e.code in PAYLOAD_FAULTS:
                # The cache served it but the device refused it (a section
                # checksum, the shape): drop it, or the recomputed chunk's
                # store would find the key held and keep the bad payload.
                self._drop(key)
            log.warning("kvtier.vllm: load of chunk %s failed, recomputing: %s", key, e)
            raise
        finally:
            if loan is not None:
                loan.close()

    def _load_group(self, keys: List[Key], blocks: List[List[int]]) -> List[Any]:
        """Loads several chunks of a job with one device.load_many: each
        chunk's result is its payload's bytes or the Error that makes it a
        miss (as _load_chunk's). The chunks a memory tier lends in place are
        batched; the others (misses, payloads copied out of nvme or remote
        tiers into the thread's one buffer) and all of them where the device
        cannot batch (None) are loaded one by one by _load_chunk."""
        results: List[Any] = [None] * len(keys)
        refused: List[int] = []  # served, but the device's verdict failed
        single: List[int] = []  # not lent in place: loaded one by one
        loans: List[Loan] = []
        held: List[int] = []
        try:
            payloads: List[np.ndarray] = []
            for i, key in enumerate(keys):
                try:
                    loan = self.cache.borrow(key)
                except Error as e:
                    if e.code not in (ErrorCode.ENOTSUP, -errno.EAGAIN):
                        results[i] = e
                        refused.append(i)
                        continue
                    loan = None  # a tier that cannot lend, or loans all out
                if loan is None or loan.array is None:
                    if loan is not None:
                        loan.close()
                    single.append(i)  # a miss, or copied out: _load_chunk's way
                    continue
                loans.append(loan)
                held.append(i)
                payloads.append(loan.array)
            outcomes = None
            if len(held) > 1:
                try:
                    outcomes = self.device.load_many(  # type: ignore[attr-defined]
                        payloads, [blocks[i] for i in held], keys=[keys[i] for i in held])
                    if outcomes is not None and len(outcomes) != len(held):
                        raise RuntimeError(f"device.load_many gave {len(outcomes)} outcomes "
                                           f"for {len(held)} chunks")
                except Exception as e:  # the device failed (KVT_ECUDA, a bug): not the payloads
                    log.warning("kvtier.vllm: a group load of %d chunks failed, recomputing "
                                "them: %s", len(held), e)
                    self._reason(e.name if isinstance(e, Error) else type(e).__name__)
                    for i in held:
                        results[i] = e
                    held = []
            if outcomes is None:
                single = sorted(single + held)
                held = []
            for i, payload, err in zip(held, payloads, outcomes or []):
                results[i] = len(payload) if err is None else err
                if err is not None:
                    refused.append(i)
        finally:
            for loan in loans:
                loan.close()  # a delete waits for the loan
        for i in sorted(refused):  # before anything else can raise
            e = results[i]
            if i in held and isinstance(e, Error) and e.code in PAYLOAD_FAULTS:
                self._drop(keys[i])  # served but refused: see _load_chunk
            self._reason(e.name if isinstance(e, Error) else type(e).__name__)
            log.warning("kvtier.vllm: load of chunk %s failed, recomputing: %s", keys[i], e)
        for i in single:  # each logs its own failure
            try:
                results[i] = self._load_chunk(keys[i], blocks[i])
            except Exception as e:  # as _task counts it
                results[i] = e
                self._reason(e.name if isinstance(e, Error) else type(e).__name__)
        return results

    def _fetch(self, key: Key) -> Tuple[Optional[Loan], Optional[np.ndarray]]:
        """The payload under key: lent in place by a memory tier, else copied
        into this thread's host buffer; (None, None) on a miss."""
        try:
            loan = self.cache.borrow(key)
        except Error as e:
            if e.code not in (ErrorCode.ENOTSUP, -errno.EAGAIN):
                raise
            loan = None  # a tier that cannot lend (nvme, remote), or loans all out
        if loan is not None and loan.array is not None:
            return loan, loan.array
        if loan is not None:  # GPU memory (an hbm tier): copied out like nvme's
            loan.close()
        return None, self._get(key)

    def _drop(self, key: Key) -> None:
        try:
            self.cache.delete(key)
        except Error as e:
            log.warning("kvtier.vllm: could not delete refused payload %s: %s", key, e)

    def _get(self, key: Key) -> Optional[np.ndarray]:
        """The payload under key in this thread's host buffer, or None."""
        size = self.cache.query(key)
        if size is None:  # not indexed: a shared tier may hold it
            data = self.cache.get(key)
            if data is None:
                return None
            buf = self._buffer(len(data))
            buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
            return buf[:len(data)]
        buf = self._buffer(size[0])
        n = self.cache.get_into(key, buf)
        return None if n is None else buf[:n]
