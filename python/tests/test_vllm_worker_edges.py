"""The plug-in worker under adversarial use (from the issue-18 review; the
tests that say "at 8c95c7b" reproduced defects of that commit)."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this Python")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.v1.kv_offload.base import GPULoadStoreSpec, make_offload_key  # noqa: E402

import kvtier  # noqa: E402
from kvtier.vllm import KvtierLoadSpec, KvtierStoreSpec, KvtierWorker  # noqa: E402
from kvtier.vllm.config import CacheShape, model_fingerprint  # noqa: E402
from kvtier.vllm.spec import DeviceSpec  # noqa: E402
import vllm_support as vs  # noqa: E402

SHAPE = CacheShape(layers=vs.LAYERS, kv_heads=vs.KV_HEADS, head_dim=vs.HEAD_DIM, dtype="bf16",
                   block_size=16, num_blocks=64, layer_names=("layer.0", "layer.1"))
FP = model_fingerprint("m", SHAPE, "k16v8", 0, 1)


def _keys(n: int, salt: int = 0) -> list:
    return [make_offload_key(bytes([salt, i]) * 16, 0) for i in range(n)]


class SlowDevice(vs.CpuDevice):
    """The CPU stand-in, with a delay per store / load and an optional error."""

    store_s = 0.0
    load_s = 0.0
    load_error: object = None

    def store(self, *a, **kw):
        time.sleep(self.store_s)
        return super().store(*a, **kw)

    def load(self, *a, **kw):
        time.sleep(self.load_s)
        if self.load_error is not None:
            raise self.load_error
        return super().load(*a, **kw)


def _worker(tiers: str = "dram:64MiB", threads: int = 4,
            device: type = SlowDevice) -> KvtierWorker:
    layers = [torch.zeros((64, vs.KV_HEADS, 16, 2 * vs.HEAD_DIM), dtype=torch.bfloat16)
              for _ in range(vs.LAYERS)]
    dev = device(DeviceSpec(layers=layers, shape=SHAPE, codec="k16v8", fingerprint=FP,
                                tp_rank=0, tp_size=1, kv_cache_layout=None))
    rng = np.random.default_rng(5)
    for t in dev.layers:
        t[...] = (rng.standard_normal(t.shape, dtype=np.float32).view(np.uint32) >> 16)
    return KvtierWorker(dev, kvtier.Cache(tiers, fingerprint=FP, chunk_tokens=32), FP,
                        chunk_tokens=32, blocks_per_chunk=2, threads=threads)


def _run(w, submit, job, *args):
    assert submit(job, *args)
    w.wait({job})
    (res,) = w.get_finished()
    return res


def _store(w, job, okeys, first_block=0):
    n = 2 * len(okeys)
    src = GPULoadStoreSpec(list(range(first_block, first_block + n)), group_sizes=[n],
                           block_indices=[0])
    return _run(w, w.submit_store, job, src,
                KvtierStoreSpec(okeys, [None] + okeys[:-1]))


def test_expedited_load_does_not_wait_for_queued_stores() -> None:
    """At 8c95c7b: vLLM (kv_offload/base.py:676): 'An expedited load is waited
    on within the step, so it should not queue behind regular loads.' The
    worker ignores `expedited`: a sync load queues behind every store chunk
    already submitted, and start_kv_transfers() blocks the step on it."""
    w = _worker(threads=2)
    try:
        okeys = _keys(1, salt=1)
        assert _store(w, 1, okeys).success
        w.device.store_s = 0.2
        big = _keys(16, salt=2)  # 16 chunks x 0.2 s over 2 threads: 1.6 s of stores
        src = GPULoadStoreSpec(list(range(32, 64)), group_sizes=[32], block_indices=[0])
        assert w.submit_store(2, src, KvtierStoreSpec(big, [None] + big[:-1]))
        t0 = time.perf_counter()
        dst = GPULoadStoreSpec([10, 11], group_sizes=[2], block_indices=[0])
        assert w.submit_load(3, KvtierLoadSpec(okeys), dst, expedited=True)
        w.wait({3})
        waited = time.perf_counter() - t0
        w.wait({2})
        assert waited < 0.8, f"the expedited load waited {waited:.2f} s behind stores"
    finally:
        w.shutdown()


def test_a_transient_device_error_does_not_delete_a_good_payload() -> None:
    """At 8c95c7b: Any kvtier.Error from device.load (KVT_ECUDA, -ENOMEM:
    the payload is fine) makes _load_chunk delete the payload from the cache
    (every tier, shared ones too)."""
    w = _worker()
    try:
        okeys = _keys(1, salt=3)
        assert _store(w, 1, okeys).success
        w.device.load_error = kvtier.Error(kvtier.ErrorCode.ECUDA, detail="out of memory")
        dst = GPULoadStoreSpec([10, 11], group_sizes=[2], block_indices=[0])
        assert not _run(w, w.submit_load, 2, KvtierLoadSpec(okeys), dst).success
        assert w.cache.query(w.key(okeys[0])) is not None, "a good payload was deleted"
    finally:
        w.shutdown()


def test_a_job_larger_than_the_tier_keeps_its_prefix() -> None:
    """At 8c95c7b: Stores put every chunk without prev (a root), so a job's
    later chunks evict its own first chunks (the coldest roots); the job is
    reported successful and the manager counts every chunk as held, while
    the cache holds a tail no lookup can reach. Put with prev in order (the
    cache's prefix-aware placement), the tail is refused instead."""
    probe = _worker()
    okeys = _keys(12, salt=4)
    assert _store(probe, 1, okeys[:1]).success
    size = probe.cache.query(probe.key(okeys[0]))[0]
    probe.shutdown()
    w = _worker(tiers=f"dram:{6 * size + 4096}", threads=4)
    try:
        res = _store(w, 1, okeys)
        keys = [w.key(k) for k in okeys]
        held = [w.cache.query(k) is not None for k in keys]
        prefix = w.cache.lookup_keys(keys)
        stored = len(okeys) - len(res.failed_keys)
        print("success", res.success, "failed", len(res.failed_keys), "held", held,
              "prefix", prefix)
        assert prefix == stored, (f"{stored} chunks reported stored, only {prefix} "
                                  f"reachable from the start; held: {held}")
    finally:
        w.shutdown()


def test_many_threads_over_the_dram_pin_limit_load_everything() -> None:
    """More transfer threads than the dram tier's 64 pins: borrow says
    EAGAIN, the worker copies instead; every loan goes back."""
    w = _worker(threads=80)
    try:
        okeys = _keys(24, salt=5)
        assert _store(w, 1, okeys).success
        w.device.load_s = 0.05
        jobs = []
        for j in range(5):
            dst = GPULoadStoreSpec(list(range(0, 48)), group_sizes=[48], block_indices=[0])
            assert w.submit_load(10 + j, KvtierLoadSpec(okeys), dst)
            jobs.append(10 + j)
        w.wait(set(jobs))
        res = w.get_finished()
        assert len(res) == 5 and all(r.success for r in res)
        assert w.cache.stats().pinned == 0
    finally:
        w.shutdown()


def test_submit_after_shutdown_does_not_leave_a_job_that_wait_hangs_on() -> None:
    """After shutdown() a submit returns False and leaves nothing that
    wait() could hang on (at 8c95c7b it raised and left the job registered)."""
    w = _worker()
    okeys = _keys(2, salt=6)
    w.shutdown()
    dst = GPULoadStoreSpec([10, 11, 12, 13], group_sizes=[4], block_indices=[0])
    assert not w.submit_load(1, KvtierLoadSpec(okeys), dst)  # not submitted
    t = threading.Thread(target=w.wait, args=({1},), daemon=True)
    t.start()
    t.join(2)
    assert not t.is_alive(), "wait() hangs on a job that was never submitted"


def test_two_jobs_refusing_the_same_lent_payload_do_not_deadlock() -> None:
    """Both loaders hold a loan on one key; each drops it after its refusal:
    the first delete waits for the other's loan, which goes back first."""
    w = _worker(threads=2)
    try:
        okeys = _keys(1, salt=7)
        assert _store(w, 1, okeys).success
        w.device.load_s = 0.3
        w.device.load_error = kvtier.Error(kvtier.ErrorCode.ESHAPE, detail="refused")
        for j in (2, 3):
            dst = GPULoadStoreSpec([10 + 2 * j, 11 + 2 * j], group_sizes=[2], block_indices=[0])
            assert w.submit_load(j, KvtierLoadSpec(okeys), dst)
        done = threading.Event()
        threading.Thread(target=lambda: (w.wait({2, 3}), done.set()), daemon=True).start()
        assert done.wait(5), "deadlock"
        res = w.get_finished()
        assert len(res) == 2 and not any(r.success for r in res)
        assert w.cache.stats().pinned == 0 and w.cache.query(w.key(okeys[0])) is None
    finally:
        w.shutdown()


def test_a_key_stored_again_by_a_later_job_does_not_block_the_first_job() -> None:
    """Job 1 stores [A, B]; job 2, submitted while A is being stored, stores
    [A] again. job 2's event replaces job 1's in _putting, so job 1's B
    waits for job 2's A, which is queued behind B: with one transfer thread
    neither job ever finishes."""
    w = _worker(threads=1)
    try:
        okeys = _keys(2, salt=8)
        w.device.store_s = 0.3
        src = GPULoadStoreSpec([0, 1, 2, 3], group_sizes=[4], block_indices=[0])
        assert w.submit_store(1, src, KvtierStoreSpec(okeys, [None, okeys[0]]))
        time.sleep(0.1)  # job 1's A is being stored
        src2 = GPULoadStoreSpec([0, 1], group_sizes=[2], block_indices=[0])
        assert w.submit_store(2, src2, KvtierStoreSpec(okeys[:1], [None]))
        done = threading.Event()
        threading.Thread(target=lambda: (w.wait({1, 2}), done.set()), daemon=True).start()
        assert done.wait(5), "deadlock: job 1's B waits for job 2's A, queued behind it"
    finally:
        if done.is_set():
            w.shutdown()


# --- loads in groups (device.load_many; from the review of 42a54bc: the
# three tests below failed there) -------------------------------------------------


def _corrupt(w: KvtierWorker, okeys: list, i: int) -> kvtier.Key:
    key = w.key(okeys[i])
    p = bytearray(w.cache.get(key))
    p[-100] ^= 1  # a section byte: the header still parses
    w.cache.delete(key)
    w.cache.put(key, bytes(p), w.key(okeys[i - 1]) if i else None)
    return key


def _load(w: KvtierWorker, job: int, okeys: list, first_block: int = 32):
    n = 2 * len(okeys)
    dst = GPULoadStoreSpec(list(range(first_block, first_block + n)), group_sizes=[n],
                           block_indices=[0])
    return _run(w, w.submit_load, job, KvtierLoadSpec(okeys), dst)


def test_a_refused_chunk_is_dropped_even_when_a_later_chunk_of_its_group_raises() -> None:
    """A group: chunk 1 fails its checksum on the device, chunk 3 (not lent)
    raises a non-kvtier exception when loaded one by one. The refused
    payload must still leave the cache, or the recomputed chunk's store
    finds the key held and every later load misses."""
    w = _worker(device=vs.BatchCpuDevice, threads=1)
    try:
        okeys = _keys(4, salt=20)
        assert _store(w, 1, okeys).success
        bad = _corrupt(w, okeys, 1)
        other = w.key(okeys[3])
        borrow, load = w.cache.borrow, w.device.load

        def no_loan(key):
            if key == other:
                raise kvtier.Error(kvtier.ErrorCode.ENOTSUP, detail="as an nvme tier")
            return borrow(key)

        def fails(payload, ids, *, key):
            if key == other:
                raise RuntimeError("CUDA out of memory (from torch)")
            return load(payload, ids, key=key)

        w.cache.borrow, w.device.load = no_loan, fails
        res = _load(w, 2, okeys)
        assert not res.success and set(res.failed_keys) == {okeys[1], okeys[3]}
        assert w.cache.query(bad) is None, "the refused payload stayed in the cache"
        assert w.stats.reasons == {"KVT_ECHECKSUM": 1, "RuntimeError": 1}
    finally:
        w.shutdown()


def test_a_device_answering_too_few_outcomes_fails_the_group() -> None:
    """load_many must answer for every chunk: a chunk without an outcome was
    not written and must not be reported loaded."""
    class Short(vs.BatchCpuDevice):
        def load_many(self, payloads, block_ids, *, keys):
            return super().load_many(payloads[:-1], block_ids[:-1], keys=keys[:-1])

    w = _worker(device=Short, threads=1)
    try:
        okeys = _keys(4, salt=21)
        assert _store(w, 1, okeys).success
        res = _load(w, 2, okeys)
        assert not res.success and res.failed_keys == okeys
        assert all(w.cache.query(w.key(k)) is not None for k in okeys)  # nothing dropped
    finally:
        w.shutdown()


@pytest.mark.parametrize("error", ["KVT_ECUDA", "RuntimeError"])
def test_a_group_whose_load_many_raises_fails_its_chunks_and_drops_nothing(error: str) -> None:
    """A device failure (not the payloads'): every chunk of the group is a
    miss, none is deleted, every loan goes back; chunks loaded one by one in
    the same group are still loaded."""
    class Raising(vs.BatchCpuDevice):
        def load_many(self, payloads, block_ids, *, keys):
            if error == "KVT_ECUDA":
                raise kvtier.Error(kvtier.ErrorCode.ECUDA, detail="launch failed")
            raise RuntimeError("boom")

    w = _worker(device=Raising, threads=2)
    try:
        okeys = _keys(12, salt=22)
        assert _store(w, 1, okeys).success
        res = _load(w, 2, okeys)
        assert not res.success and res.failed_keys == okeys  # 2 groups of 6, both raised
        assert res.invalid_block_ids == list(range(32, 56))
        assert w.cache.stats().pinned == 0
        assert all(w.cache.query(w.key(k)) is not None for k in okeys)
        assert w.stats.reasons == {error: 2}
    finally:
        w.shutdown()


def test_a_small_job_spreads_its_groups_over_the_threads() -> None:
    """Groups hold at most ceil(chunks / threads) chunks: 8 chunks on 4
    threads load in 4 groups of 2, not one group of 8 on one thread."""
    w = _worker(device=vs.BatchCpuDevice, threads=4)
    try:
        okeys = _keys(8, salt=23)
        assert _store(w, 1, okeys).success
        assert _load(w, 2, okeys).success
        assert w.device.batches == 4 and w.device.batched == 8
    finally:
        w.shutdown()
