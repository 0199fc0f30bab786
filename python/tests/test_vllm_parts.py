"""The vLLM plug-in's parts against vLLM 0.33.0's classes: keys and
fingerprints, what it refuses, the manager's index and probes, the worker's
jobs over a CPU stand-in for the GPU handle (vllm_support.CpuDevice)."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed in this Python; './bootstrap.sh vllm' installs "
    "vLLM 0.33.0 into ${KVT_VLLM_VENV:-~/.cache/kvtier/venv-vllm} and runs these tests "
    "(ctest's test_vllm runs them with that venv)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, MambaSpec, MLAAttentionSpec)
from vllm.v1.kv_offload.base import (GPULoadStoreSpec, LookupResult, ReqContext,  # noqa: E402
                                     make_offload_key)

import kvtier  # noqa: E402
from kvtier.vllm import (KvtierConnector, KvtierLoadSpec, KvtierManager,  # noqa: E402
                         KvtierStoreSpec, KvtierWorker, Refused, chunk_key_of)
from kvtier.vllm.config import CacheShape, PluginConfig, model_fingerprint  # noqa: E402
from kvtier.vllm.spec import DeviceSpec  # noqa: E402
from kvtier.vllm.worker import chunk_blocks  # noqa: E402
import vllm_support as vs  # noqa: E402

SHAPE = CacheShape(layers=vs.LAYERS, kv_heads=vs.KV_HEADS, head_dim=vs.HEAD_DIM, dtype="bf16",
                   block_size=16, num_blocks=32, layer_names=("layer.0", "layer.1"))


def test_vllm_is_the_pinned_release() -> None:
    assert vllm.__version__ == kvtier.vllm.VLLM_VERSION


# --- keys ----------------------------------------------------------------------


def test_chunk_keys_name_prefix_model_rank_codec_and_chunk_size() -> None:
    fp = model_fingerprint("m", SHAPE, "k16v8", 0, 2)
    okey = make_offload_key(bytes(range(32)), 0)
    key = chunk_key_of(fp, okey, 16)
    assert key == chunk_key_of(model_fingerprint("m", SHAPE, "k16v8", 0, 2), okey, 16)
    others = [
        chunk_key_of(model_fingerprint("m", SHAPE, "k16v8", 1, 2), okey, 16),  # other rank
        chunk_key_of(model_fingerprint("m2", SHAPE, "k16v8", 0, 2), okey, 16),  # other model
        chunk_key_of(model_fingerprint("m", SHAPE, "raw", 0, 2), okey, 16),  # other codec
        chunk_key_of(fp, okey, 32),  # other chunk size
        chunk_key_of(fp, make_offload_key(bytes(range(32)), 1), 16),  # other group
        chunk_key_of(fp, make_offload_key(bytes(range(1, 33)), 0), 16),  # other prefix
    ]
    assert len({key, *others}) == 1 + len(others)


def test_rank_tiers_need_a_directory_per_rank() -> None:
    cfg = PluginConfig.from_extra({"tiers": "dram:1GiB;nvme:/tmp/x:1GiB"})
    assert cfg.rank_tiers(0, 1, 1, 0, 1) == "dram:1GiB;nvme:/tmp/x:1GiB"
    with pytest.raises(Refused, match=r"\{rank\}"):
        cfg.rank_tiers(1, 2, 2, 0, 1)
    per_rank = PluginConfig.from_extra({"tiers": "nvme:/tmp/x/r{rank}-of{tp_size}:1GiB"})
    assert per_rank.rank_tiers(1, 2, 2, 0, 1) == "nvme:/tmp/x/r1-of2:1GiB"
    with pytest.raises(Refused, match="tiers"):
        PluginConfig.from_extra({})
    with pytest.raises(kvtier.Error):
        PluginConfig.from_extra({"tiers": "dram:1GiB", "codec": "k3v9"})


def test_transfer_threads_default_to_4_or_8_with_a_device_factory() -> None:
    assert PluginConfig.from_extra({"tiers": "dram:1GiB"}).transfer_threads == 4
    factory = {"tiers": "dram:1GiB", "device": "vllm_support:cpu_device"}
    assert PluginConfig.from_extra(factory).transfer_threads == 8
    assert PluginConfig.from_extra({**factory, "threads": 2}).transfer_threads == 2


# --- refusals -------------------------------------------------------------------


def _connector(tmp_path, kv_cfg: KVCacheConfig, **kw) -> KvtierConnector:
    extra = {"tiers": "dram:64MiB", "device": "vllm_support:cpu_device"}
    extra.update(kw.pop("extra", {}))
    cfg = vs.make_vllm_config(vs.write_model_dir(tmp_path / "model"), extra, **kw)
    return KvtierConnector(cfg, KVConnectorRole.SCHEDULER, kv_cfg)


def _group(names, spec) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(list(names), spec)


@pytest.mark.parametrize("what,kv_cfg,kw,match", [
    ("fp8 KV cache", vs.full_attention_config(32), {"cache_dtype": "fp8"}, "fp8"),
    ("fp32 KV cache", vs.full_attention_config(32, dtype=torch.float32), {}, "bf16 and fp16"),
    ("MLA", KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[_group(
        ["layer.0", "layer.1"], MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=64,
                                                 dtype=torch.bfloat16))]), {}, "MLA"),
    ("Mamba hybrid", KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[
        _group(["layer.0"], FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16,
                                              dtype=torch.bfloat16)),
        _group(["layer.1"], MambaSpec(block_size=16, shapes=((4, 4),), dtypes=(torch.bfloat16,)))]),
     {}, "Mamba"),
    ("fail policy", vs.full_attention_config(32), {"policy": "fail"}, "recompute"),
])
def test_unsupported_caches_are_refused_with_the_reason(tmp_path, what, kv_cfg, kw, match) -> None:
    with pytest.raises(Refused, match=match):
        _connector(tmp_path, kv_cfg, **kw)


def test_spec_under_the_plain_offloading_connector_is_refused(tmp_path) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector)
    extra = {"tiers": "dram:64MiB", "spec_name": "KvtierOffloadingSpec",
             "spec_module_path": "kvtier.vllm.spec"}
    cfg = vs.make_vllm_config(vs.write_model_dir(tmp_path / "model"), extra,
                              connector="OffloadingConnector", module_path=None)
    with pytest.raises(Refused, match="KvtierConnector"):
        OffloadingConnector(cfg, KVConnectorRole.SCHEDULER, vs.full_attention_config(32))


# --- the manager ------------------------------------------------------------------


def _keys(n: int, salt: int = 0) -> list:
    return [make_offload_key(bytes([salt, i]) * 16, 0) for i in range(n)]


def test_manager_asks_the_workers_about_unknown_keys_and_needs_every_rank() -> None:
    m = KvtierManager(num_workers=2, chunk_tokens=16)
    ctx = ReqContext(req_id="a")
    a, b, c = _keys(3)
    assert [m.lookup(k, ctx) for k in (a, b, c)] == [LookupResult.RETRY] * 3
    assert m.has_pending_work()
    assert m.take_probes() == [a, b, c]
    assert m.lookup(a, ctx) is LookupResult.RETRY  # asked, not answered: not asked again
    assert m.take_probes() == []
    m.on_probe_answers({a: 1, b: 1, c: 1}, {a: 1, b: 1})  # rank 0
    assert m.lookup(a, ctx) is LookupResult.RETRY
    m.on_probe_answers({a: 1, b: 1, c: 1}, {a: 1})  # rank 1: b only on rank 0
    assert [m.lookup(k, ctx) for k in (a, b, c)] == [LookupResult.HIT, LookupResult.MISS,
                                                      LookupResult.MISS]


def test_manager_stores_become_hits_unless_a_rank_failed() -> None:
    m = KvtierManager(num_workers=1, chunk_tokens=16)
    ctx = ReqContext(req_id="a")
    a, b = _keys(2)
    for i, k in enumerate((a, b)):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    out = m.prepare_store([a, b], ctx)
    assert out is not None and out.keys_to_store == [a, b]
    assert isinstance(out.store_spec, KvtierStoreSpec) and out.store_spec.prevs == [None, a]
    assert m.lookup(a, ctx) is LookupResult.HIT_PENDING
    assert m.prepare_store([a], ctx).keys_to_store == []  # in flight: not twice
    m.on_failed_stores([b])
    m.complete_store([a, b], ctx)
    assert m.lookup(a, ctx) is LookupResult.HIT
    assert m.lookup(b, ctx) is LookupResult.RETRY  # unknown again: asked
    m.on_failed_loads([a])
    assert m.lookup(a, ctx) is LookupResult.MISS
    spec = m.prepare_load([a], ctx)
    assert isinstance(spec, KvtierLoadSpec) and spec.keys == [a]


def test_manager_asks_again_when_no_worker_answered(monkeypatch) -> None:
    import kvtier.vllm.manager as mm

    m = KvtierManager(num_workers=1, chunk_tokens=16)
    ctx = ReqContext(req_id="a")
    (a,) = _keys(1, salt=8)
    m.lookup(a, ctx)
    assert m.take_probes() == [a]
    m.lookup(a, ctx)
    assert m.take_probes() == []  # in flight
    monkeypatch.setattr(mm, "PROBE_TIMEOUT_S", 0.0)
    m.lookup(a, ctx)
    assert m.take_probes() == [a]  # unanswered too long: sent again


def test_manager_forgets_absent_keys_of_shared_tiers_after_the_ttl() -> None:
    m = KvtierManager(num_workers=1, chunk_tokens=16, absent_ttl_s=0.0)
    ctx = ReqContext(req_id="a")
    (a,) = _keys(1)
    m.lookup(a, ctx)
    m.take_probes()
    m.on_probe_answers({a: 1}, {})
    assert m.lookup(a, ctx) is LookupResult.RETRY  # expired at once: asked again


# --- the worker over the CPU stand-in --------------------------------------------


def _tiers(kind: str, tmp_path) -> str:
    # nvme: payloads are copied into the worker's host buffers; dram: they
    # are borrowed in place (Cache.borrow), and handed to the device as is.
    return f"nvme:{tmp_path}/nvme:64MiB" if kind == "nvme" else "dram:64MiB"


@pytest.fixture(params=["nvme", "dram", "dram+batch"])
def worker(tmp_path, request):
    """The worker over the CPU stand-in; "+batch": a device with load_many
    (the worker then loads a job's lent chunks in groups, as on CUDA)."""
    fp = model_fingerprint("m", SHAPE, "k16v8", 0, 1)
    layers = [torch.zeros((32, vs.KV_HEADS, 16, 2 * vs.HEAD_DIM), dtype=torch.bfloat16)
              for _ in range(vs.LAYERS)]
    kind, _, batch = request.param.partition("+")
    device = vs.BatchCpuDevice if batch else vs.CpuDevice
    dev = device(DeviceSpec(layers=layers, shape=SHAPE, codec="k16v8", fingerprint=fp,
                            tp_rank=0, tp_size=1, kv_cache_layout=None))
    rng = np.random.default_rng(5)
    for t in dev.layers:  # finite bf16 values
        t[...] = (rng.standard_normal(t.shape, dtype=np.float32).view(np.uint32) >> 16)
    w = KvtierWorker(dev, kvtier.Cache(_tiers(kind, tmp_path), fingerprint=fp,
                                       chunk_tokens=32),
                     fp, chunk_tokens=32, blocks_per_chunk=2)
    w.tiers = kind
    yield w
    w.shutdown()


def _run(w: KvtierWorker, submit, *args):
    job = submit(*args)
    assert job
    w.wait({args[0]})
    (res,) = w.get_finished()
    return res


def test_chunk_blocks_start_and_end_inside_chunks() -> None:
    spec = GPULoadStoreSpec([7, 8, 9], group_sizes=[3], block_indices=[3])
    assert chunk_blocks(spec, 2, 2) == [[-1, 7], [8, 9]]
    spec = GPULoadStoreSpec([7, 8, 9], group_sizes=[3], block_indices=[0])
    assert chunk_blocks(spec, 2, 2) == [[7, 8], [9, -1]]


def test_worker_store_then_load_into_other_blocks(worker) -> None:
    okeys = _keys(2)
    src = GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[4], block_indices=[0])
    res = _run(worker, worker.submit_store, 1, src, KvtierStoreSpec(okeys, [None, okeys[0]]))
    assert res.success and res.transfer_size > 0
    assert worker.probe(okeys) == set(okeys)
    # dram: written in place into blocks reserved in the tier; nvme cannot
    # reserve, so the worker stores through its host buffers from then on.
    assert worker._reserving == (worker.tiers == "dram")
    assert worker.cache.stats(0).puts == 2
    before = [t.copy() for t in worker.device.layers]
    dst = GPULoadStoreSpec([10, 11, 12], group_sizes=[3], block_indices=[1])  # skips block 1
    res = _run(worker, worker.submit_load, 2, KvtierLoadSpec(okeys), dst)
    assert res.success
    hd = vs.HEAD_DIM
    for t, old in zip(worker.device.layers, before):
        np.testing.assert_array_equal(t[10:13, :, :, :hd], old[2:5, :, :, :hd])  # K exact
        assert not np.array_equal(t[10:13], np.zeros_like(t[10:13]))


def test_worker_reports_a_missing_payload_as_a_failed_load(worker) -> None:
    okeys = _keys(2, salt=9)
    dst = GPULoadStoreSpec([5, 6, 7, 8], group_sizes=[4], block_indices=[0])
    res = _run(worker, worker.submit_load, 3, KvtierLoadSpec(okeys), dst)
    assert not res.success
    assert res.failed_keys == okeys and res.invalid_block_ids == [5, 6, 7, 8]


def test_worker_reports_a_corrupt_payload_as_a_failed_load(worker) -> None:
    okeys = _keys(1, salt=4)
    src = GPULoadStoreSpec([1, 2], group_sizes=[2], block_indices=[0])
    assert _run(worker, worker.submit_store, 5, src, KvtierStoreSpec(okeys, [None])).success
    key = worker.key(okeys[0])
    payload = bytearray(worker.cache.get(key))
    payload[-100] ^= 1  # a section byte: the header still parses, its checksum fails
    worker.cache.delete(key)
    worker.cache.put(key, bytes(payload))
    before = [t.copy() for t in worker.device.layers]
    dst = GPULoadStoreSpec([20, 21], group_sizes=[2], block_indices=[0])
    res = _run(worker, worker.submit_load, 6, KvtierLoadSpec(okeys), dst)
    assert not res.success and res.failed_keys == okeys and res.invalid_block_ids == [20, 21]
    assert worker.stats.reasons == {"KVT_ECHECKSUM": 1}
    for t, old in zip(worker.device.layers, before):
        np.testing.assert_array_equal(t, old)  # nothing written
    assert worker.cache.query(key) is None  # dropped: the recomputed chunk can be stored


def test_worker_reports_a_foreign_payload_as_a_failed_load(worker, tmp_path) -> None:
    (okey,) = _keys(1, salt=3)
    key = worker.key(okey)
    other = model_fingerprint("another-model", SHAPE, "k16v8", 0, 1)
    k = np.zeros((vs.LAYERS, 32, vs.KV_HEADS, vs.HEAD_DIM), dtype=np.uint16)
    payload = kvtier.encode(k, k, "k16v8", dtype="bf16", key=key, fingerprint=other)
    with pytest.raises(kvtier.Error) as e:  # the cache refuses it ...
        worker.cache.put(key, payload)
    assert e.value.code == kvtier.ErrorCode.EFOREIGN
    worker.cache.close()  # ... so it is planted as another process's cache could hold it
    worker.cache = kvtier.Cache(_tiers(worker.tiers, tmp_path), chunk_tokens=32)
    worker.cache.put(key, payload)
    before = [t.copy() for t in worker.device.layers]
    dst = GPULoadStoreSpec([20, 21], group_sizes=[2], block_indices=[0])
    res = _run(worker, worker.submit_load, 4, KvtierLoadSpec([okey]), dst)
    assert not res.success and res.failed_keys == [okey] and res.invalid_block_ids == [20, 21]
    assert worker.stats.reasons == {"KVT_EFOREIGN": 1}
    for t, old in zip(worker.device.layers, before):
        np.testing.assert_array_equal(t, old)  # nothing written


def test_worker_spreads_a_job_over_its_threads_and_reports_from_the_first_failed_chunk(
        worker) -> None:
    okeys = _keys(6, salt=11)
    src = GPULoadStoreSpec(list(range(1, 13)), group_sizes=[12], block_indices=[0])
    res = _run(worker, worker.submit_store, 7, src,
               KvtierStoreSpec(okeys, [None] + okeys[:-1]))
    assert res.success and worker.cache.lookup_keys([worker.key(k) for k in okeys]) == 6
    before = [t.copy() for t in worker.device.layers]
    worker.cache.delete(worker.key(okeys[3]))  # a hole in the middle
    dst = GPULoadStoreSpec(list(range(14, 26)), group_sizes=[12], block_indices=[0])
    res = _run(worker, worker.submit_load, 8, KvtierLoadSpec(okeys), dst)
    assert not res.success and res.failed_keys == [okeys[3]]
    assert res.invalid_block_ids == list(range(20, 26))  # chunk 3 on: recomputed
    assert worker.stats.reasons == {"KVT_ENOTFOUND": 1}
    hd = vs.HEAD_DIM
    for t, old in zip(worker.device.layers, before):
        np.testing.assert_array_equal(t[14:20, :, :, :hd], old[1:7, :, :, :hd])  # chunks 0-2
        np.testing.assert_array_equal(t[20:22], old[20:22])  # chunk 3: not written
    assert worker.cache.stats().pinned == 0  # every loan went back
    if isinstance(worker.device, vs.BatchCpuDevice):  # groups of 2 on 4 threads; chunk
        assert worker.device.batches == 2 and worker.device.batched == 4  # 2 alone: one by one


def test_worker_loading_in_groups_makes_a_corrupt_chunk_alone_a_miss(worker) -> None:
    """In a group loaded with load_many, the chunk whose payload fails its
    checksum is the miss (dropped from the cache, reported from it on); the
    chunks before it are written."""
    okeys = _keys(5, salt=12)
    src = GPULoadStoreSpec(list(range(1, 11)), group_sizes=[10], block_indices=[0])
    assert _run(worker, worker.submit_store, 9, src,
                KvtierStoreSpec(okeys, [None] + okeys[:-1])).success
    key = worker.key(okeys[2])
    payload = bytearray(worker.cache.get(key))
    payload[-100] ^= 1
    worker.cache.delete(key)
    worker.cache.put(key, bytes(payload), worker.key(okeys[1]))
    before = [t.copy() for t in worker.device.layers]
    dst = GPULoadStoreSpec(list(range(14, 24)), group_sizes=[10], block_indices=[0])
    res = _run(worker, worker.submit_load, 10, KvtierLoadSpec(okeys), dst)
    assert not res.success and res.failed_keys == [okeys[2]]
    assert res.invalid_block_ids == list(range(18, 24))
    assert worker.stats.reasons == {"KVT_ECHECKSUM": 1}
    hd = vs.HEAD_DIM
    for t, old in zip(worker.device.layers, before):
        np.testing.assert_array_equal(t[14:18, :, :, :hd], old[1:5, :, :, :hd])  # chunks 0-1
        np.testing.assert_array_equal(t[18:20], old[18:20])  # chunk 2: not written
    assert worker.cache.query(key) is None  # dropped
    assert worker.cache.stats().pinned == 0
    if isinstance(worker.device, vs.BatchCpuDevice):  # groups [0, 1], [2, 3], [4]
        assert worker.device.batches == 2


def test_worker_reports_of_two_ranks_aggregate_before_the_manager_reads_them() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingWorkerMetadata)
    from kvtier.vllm import KvtierWorkerMetadata

    a, b, c = _keys(3, salt=7)
    rank0 = KvtierWorkerMetadata(completed_jobs={1: 1}, probe_answered={a: 1, b: 1},
                                 probe_held={a: 1, b: 1}, failed_store_keys={c})
    rank1 = KvtierWorkerMetadata(completed_jobs={1: 1}, probe_answered={a: 1, b: 1},
                                 probe_held={a: 1}, failed_load_keys={b})
    both = rank0.aggregate(rank1).aggregate(OffloadingWorkerMetadata(completed_jobs={2: 1}))
    assert isinstance(both, KvtierWorkerMetadata)
    assert both.completed_jobs == {1: 2, 2: 1}
    assert both.probe_answered == {a: 2, b: 2} and both.probe_held == {a: 2, b: 1}
    assert both.failed_store_keys == {c} and both.failed_load_keys == {b}
    m = KvtierManager(num_workers=2, chunk_tokens=16)
    ctx = ReqContext(req_id="a")
    m.lookup(a, ctx), m.lookup(b, ctx)
    m.take_probes()
    m.on_probe_answers(both.probe_answered, both.probe_held)
    assert m.lookup(a, ctx) is LookupResult.HIT and m.lookup(b, ctx) is LookupResult.MISS
