"""kvtier.lmcache against LMCache 0.5.6's own classes on CPU: the plug-in is
built by LMCache's storage_plugin_launcher from an LMCacheEngineConfig read
from a YAML file (or a dict), with LMCache's LocalCPUBackend as the allocator
of the objects it returns, as CreateStorageBackends does in a worker."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

pytest.importorskip(
    "lmcache.v1.storage_backend",
    reason="LMCache is not installed in this Python; './bootstrap.sh lmcache' makes "
    "${KVT_LMCACHE_VENV:-~/.cache/kvtier/venv-lmcache} with LMCache 0.5.6 and runs these tests "
    "(ctest's test_lmcache runs them with that venv)")

import torch  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import storage_plugin_launcher  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

import kvtier  # noqa: E402
import kvtier.lmcache as lmc  # noqa: E402
from kvtier.codec import decode, encode_bound, encode_into  # noqa: E402
from kvtier.lmcache import KvtierStoragePlugin, Refused  # noqa: E402

LAYERS, HEADS, DIM, CHUNK = 3, 2, 32, 16
MODEL = "test/llama-tiny"


@pytest.fixture(autouse=True)
def collect_memory_objs() -> Any:
    """Frees each test's MemoryObjs when it ends. In LMCache 0.5.6 a
    MemoryObj's __del__ frees it under LMCache's shared observability lock,
    which is not reentrant: collected by a garbage-collector pass that runs
    while LMCache holds that lock (PrometheusLogger.GetOrCreate, as a new
    LocalCPUBackend makes), it deadlocks the process."""
    yield
    gc.collect()


def engine_config(tiers: str, codec: str = "raw", **more: Any) -> Dict[str, Any]:
    extra = {"storage_plugin.kvtier.module_path": "kvtier.lmcache",
             "storage_plugin.kvtier.class_name": "KvtierStoragePlugin",
             "storage_plugin.kvtier.tiers": tiers, "storage_plugin.kvtier.codec": codec}
    extra.update({f"storage_plugin.kvtier.{k}": v for k, v in more.items()})
    return {"chunk_size": CHUNK, "local_cpu": False, "max_local_cpu_size": 0.05,
            "storage_plugins": ["kvtier"], "extra_config": extra}


def metadata(dtype: Any = torch.bfloat16, worker: int = 0, world: int = 1,
             mla: bool = False) -> LMCacheMetadata:
    shape = (LAYERS, 1, CHUNK, 1, DIM) if mla else (LAYERS, 2, CHUNK, HEADS, DIM)
    return LMCacheMetadata(model_name=MODEL, world_size=world, local_world_size=world,
                           worker_id=worker, local_worker_id=worker, kv_dtype=dtype,
                           kv_shape=shape, use_mla=mla, chunk_size=CHUNK)


def launch(config: Any, md: LMCacheMetadata) -> KvtierStoragePlugin:
    """The plug-in as LMCache's CreateStorageBackends makes it in a worker."""
    gc.collect()  # not inside LocalCPUBackend's metrics setup (collect_memory_objs)
    cpu = LocalCPUBackend(config, md, dst_device="cpu")
    backends: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    storage_plugin_launcher(config, md, asyncio.new_event_loop(), cpu, "cpu", backends)
    assert "kvtier" in backends, "LMCache's launcher did not build the plug-in (see its log)"
    plugin = backends["kvtier"]
    assert isinstance(plugin, KvtierStoragePlugin) and plugin.local_cpu_backend is cpu
    return plugin


def open_plugin(tiers: str, codec: str = "raw", md: Optional[LMCacheMetadata] = None,
                **more: Any) -> KvtierStoragePlugin:
    cfg = LMCacheEngineConfig.from_dict(engine_config(tiers, codec, **more))
    return launch(cfg, md or metadata())


def key(i: int, dtype: Any = torch.bfloat16, worker: int = 0, world: int = 1) -> CacheEngineKey:
    return CacheEngineKey(MODEL, world, worker, 0x9E3779B97F4A7C15 * (i + 1) % 2**64, dtype)


def chunk(plugin: KvtierStoragePlugin, seed: int, tokens: int = CHUNK,
          dtype: Any = torch.bfloat16) -> Any:
    """A KV_2LTD chunk from LMCache's allocator, filled with random values."""
    shape = torch.Size([2, LAYERS, tokens, HEADS * DIM])
    obj = plugin.local_cpu_backend.allocate(shape, dtype, MemoryFormat.KV_2LTD)
    g = torch.Generator().manual_seed(seed)
    obj.tensor.copy_(torch.randn(shape, generator=g).to(dtype))
    return obj


def put(plugin: KvtierStoragePlugin, keys: List[CacheEngineKey], objs: List[Any]) -> None:
    futures = plugin.batched_submit_put_task(keys, objs)
    assert all(f.result() for f in futures)


def test_lmcache_launcher_builds_the_plugin_from_a_yaml_file(tmp_path: Path) -> None:
    (tmp_path / "lmcache.yaml").write_text(
        "chunk_size: 16\nlocal_cpu: false\nmax_local_cpu_size: 0.05\n"
        'storage_plugins: ["kvtier"]\nextra_config:\n'
        "  storage_plugin.kvtier.module_path: kvtier.lmcache\n"
        "  storage_plugin.kvtier.class_name: KvtierStoragePlugin\n"
        f'  storage_plugin.kvtier.tiers: "nvme:{tmp_path}/kv/w{{worker}}:64MiB"\n'
        "  storage_plugin.kvtier.codec: k16v8\n")
    cfg = LMCacheEngineConfig.from_file(str(tmp_path / "lmcache.yaml"))
    plugin = launch(cfg, metadata())
    assert plugin.tiers == f"nvme:{tmp_path}/kv/w0:64MiB"
    assert plugin.options.codec == "k16v8"
    assert plugin.get_allocator_backend() is plugin.local_cpu_backend
    plugin.close()


@pytest.mark.parametrize("codec", ["raw", "k16v8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kv_chunks_round_trip_through_the_codec(tmp_path: Path, codec: str, dtype: Any) -> None:
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", codec, metadata(dtype))
    keys = [key(i, dtype) for i in range(3)]
    objs = [chunk(plugin, i, dtype=dtype) for i in range(2)] + [chunk(plugin, 2, 5, dtype)]
    put(plugin, keys, objs)
    for k in keys:  # encoded by the codec: the payload names the model's heads
        held = plugin._held(k)
        assert held is not None and held[1] is False
        info = kvtier.inspect(plugin.cache.get(held[0]))
        assert (info.layers, info.heads, info.head_dim) == (LAYERS, HEADS, DIM)
        assert str(info.codec) == str(kvtier.CodecSpec(codec))
    got = plugin.batched_get_blocking(keys)
    for obj, back in zip(objs, got):
        assert back is not None and back.metadata.fmt == MemoryFormat.KV_2LTD
        assert back.metadata.shape == obj.metadata.shape and back.metadata.dtype == dtype
        a, b = obj.tensor.float(), back.tensor.float()
        assert torch.equal(a[0], b[0])  # K is 16-bit in both presets
        if codec == "raw":
            assert torch.equal(a[1], b[1])
        else:  # V in e4m3 with a scale: close, not equal
            assert not torch.equal(a[1], b[1])
            assert torch.allclose(a[1], b[1], atol=0.3 * a[1].abs().max().item())
    plugin.close()


def binary(plugin: KvtierStoragePlugin, n: int, seed: int) -> Any:
    """Serialized bytes (BINARY_BUFFER: the binary format LMCache 0.5.6's
    allocator makes; it refuses BINARY) from LMCache's allocator."""
    obj = plugin.local_cpu_backend.allocate(torch.Size([n]), None, MemoryFormat.BINARY_BUFFER)
    g = torch.Generator().manual_seed(seed)
    obj.byte_array[:] = bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).numpy())
    return obj


def test_binary_objects_are_stored_byte_exact_and_verified(tmp_path: Path) -> None:
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8")
    obj = binary(plugin, 1001, 7)
    put(plugin, [key(7)], [obj])
    held = plugin._held(key(7))
    assert held is not None and held[1] is True
    assert str(kvtier.inspect(plugin.cache.get(held[0])).codec) == "raw"
    back = plugin.get_blocking(key(7))
    assert back is not None and back.metadata.fmt == MemoryFormat.BINARY_BUFFER
    assert back.get_size() == 1001 and bytes(back.byte_array) == bytes(obj.byte_array)
    plugin.close()


def test_chunks_the_codec_cannot_name_go_the_raw_path(tmp_path: Path) -> None:
    """An fp32 cache and an MLA chunk: their bytes come back unchanged."""
    plugin = open_plugin(f"nvme:{tmp_path}/a:64MiB", "k16v8", metadata(torch.float32))
    obj = chunk(plugin, 3, dtype=torch.float32)
    put(plugin, [key(1, torch.float32)], [obj])
    assert plugin._held(key(1, torch.float32))[1] is True
    back = plugin.get_blocking(key(1, torch.float32))
    assert back is not None and torch.equal(back.tensor, obj.tensor)
    plugin.close()
    plugin = open_plugin(f"nvme:{tmp_path}/b:64MiB", "k16v8", metadata(mla=True))
    shape = torch.Size([1, LAYERS, CHUNK, DIM])
    obj = plugin.local_cpu_backend.allocate(shape, torch.bfloat16, MemoryFormat.KV_MLA_FMT)
    obj.tensor.copy_(torch.randn(shape).to(torch.bfloat16))
    put(plugin, [key(2)], [obj])
    back = plugin.get_blocking(key(2))
    assert back is not None and back.metadata.fmt == MemoryFormat.KV_MLA_FMT
    assert torch.equal(back.tensor, obj.tensor)
    plugin.close()


def test_contains_remove_and_pins(tmp_path: Path) -> None:
    plugin = open_plugin("dram:64MiB")
    k = key(1)
    assert not plugin.contains(k) and plugin.get_blocking(k) is None and not plugin.pin(k)
    put(plugin, [k], [chunk(plugin, 1)])
    assert plugin.contains(k) and plugin.batched_contains([k, key(2)]) == 1
    assert asyncio.run(plugin.batched_async_contains("r", [k, key(2)])) == 1
    assert plugin.contains(k, pin=True)
    assert not plugin.remove(k, force=False)  # pinned
    assert plugin.contains(k)
    assert plugin.unpin(k) and not plugin.unpin(k)
    assert plugin.remove(k, force=False)
    assert not plugin.contains(k) and plugin.get_blocking(k) is None
    assert not plugin.remove(k)
    put(plugin, [k], [chunk(plugin, 1)])
    assert plugin.pin(k) and plugin.remove(k, force=True) and not plugin.contains(k)
    plugin.close()


def test_a_put_of_a_held_key_is_skipped(tmp_path: Path) -> None:
    plugin = open_plugin("dram:64MiB")
    obj = chunk(plugin, 1)
    put(plugin, [key(1)], [obj])
    refs = obj.get_ref_count()
    assert plugin.batched_submit_put_task([key(1)], [obj]) == []
    assert obj.get_ref_count() == refs and not plugin.exists_in_put_tasks(key(1))
    plugin.close()


def test_a_chunk_flipped_on_disk_is_a_miss_and_deleted(tmp_path: Path) -> None:
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8")
    keys = [key(i) for i in range(3)]
    put(plugin, keys, [chunk(plugin, i) for i in range(3)])
    victim = plugin.kv_key(keys[1], raw=False).hex()
    path = next(p for p in tmp_path.rglob(f"*{victim}*"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    got = plugin.batched_get_blocking(keys)
    assert [o is not None for o in got] == [True, False, True]
    assert not plugin.contains(keys[1])  # deleted: the recomputed chunk is stored again
    plugin.close()


@pytest.mark.parametrize("raw_path", [False, True])
def test_a_payload_failing_its_checksum_is_a_miss_and_deleted(tmp_path: Path,
                                                               raw_path: bool) -> None:
    """Served by a tier that does not hash what it holds (DRAM), a payload
    whose section checksum fails is a miss on both paths, and deleted."""
    plugin = open_plugin("dram:64MiB", "int8")
    if raw_path:
        obj = binary(plugin, 600, 1)
    else:
        obj = chunk(plugin, 1)
    put(plugin, [key(1)], [obj])
    kk = plugin.kv_key(key(1), raw=raw_path)
    payload = bytearray(plugin.cache.get(kk))
    sec = kvtier.sections(bytes(payload))[-1]
    payload[sec.offset + sec.stored_size // 3] ^= 0x01
    plugin.cache.delete(kk)
    plugin.cache.put(kk, bytes(payload))  # the header is fine: the cache takes it
    assert plugin.contains(key(1))
    assert plugin.get_blocking(key(1)) is None
    assert not plugin.contains(key(1))
    put(plugin, [key(1)], [obj])  # stored again
    assert plugin.get_blocking(key(1)) is not None
    plugin.close()


def test_workers_keep_their_own_payloads(tmp_path: Path) -> None:
    tiers = f"nvme:{tmp_path}/w{{worker}}:64MiB"
    plugins = [open_plugin(tiers, md=metadata(worker=w, world=2)) for w in range(2)]
    assert (tmp_path / "w0").is_dir() and (tmp_path / "w1").is_dir()
    objs = [chunk(p, w) for w, p in enumerate(plugins)]
    for w, p in enumerate(plugins):
        put(p, [key(1, worker=w, world=2)], [objs[w]])
    assert plugins[0].kv_key(key(1, worker=0, world=2), False) != \
        plugins[1].kv_key(key(1, worker=1, world=2), False)
    for w, p in enumerate(plugins):
        assert torch.equal(p.get_blocking(key(1, worker=w, world=2)).tensor, objs[w].tensor)
        p.close()


def test_chunks_survive_a_restart_on_nvme(tmp_path: Path) -> None:
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8")
    obj = chunk(plugin, 5)
    put(plugin, [key(5)], [obj])
    plugin.close()
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8")
    back = plugin.get_blocking(key(5))
    assert back is not None and torch.equal(back.tensor[0], obj.tensor[0])
    plugin.close()


def test_what_the_plugin_refuses(tmp_path: Path) -> None:
    md = metadata(world=2)
    cfg = LMCacheEngineConfig.from_dict(engine_config(f"nvme:{tmp_path}:64MiB"))
    cpu = LocalCPUBackend(cfg, md, dst_device="cpu")
    with pytest.raises(Refused, match="worker"):  # two workers, one directory
        KvtierStoragePlugin(config=cfg, metadata=md, local_cpu_backend=cpu, dst_device="cpu")
    cfg = LMCacheEngineConfig.from_dict(engine_config(""))
    with pytest.raises(Refused, match="no tiers"):
        KvtierStoragePlugin(config=cfg, metadata=metadata(), local_cpu_backend=cpu)
    cfg = LMCacheEngineConfig.from_dict(engine_config("dram:1MiB", "nope"))
    with pytest.raises(kvtier.Error):
        KvtierStoragePlugin(config=cfg, metadata=metadata(), local_cpu_backend=cpu)
    # LMCache's launcher logs a plug-in that fails and goes on without it.
    backends: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    storage_plugin_launcher(cfg, metadata(), asyncio.new_event_loop(), cpu, "cpu", backends)
    assert "kvtier" not in backends


def test_lmcaches_storage_manager_puts_and_gets_through_the_plugin(tmp_path: Path) -> None:
    """LMCache's StorageManager (the engine's view of its backends) builds the
    plug-in itself, copies chunks into the plug-in's allocator, hands them
    over and drops its references (batched_put), then finds and reads them."""
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    cfg = LMCacheEngineConfig.from_dict(engine_config(f"nvme:{tmp_path}:64MiB", "k16v8"))
    gc.collect()
    sm = StorageManager(cfg, metadata(), EventManager())
    try:
        plugin = sm.storage_backends["kvtier"]
        assert isinstance(plugin, KvtierStoragePlugin)
        keys = [key(i) for i in range(3)]
        objs = [chunk(plugin, i) for i in range(3)]
        want = [o.tensor.clone() for o in objs]
        sm.batched_put(keys, objs)
        for k in keys:  # the puts run on the plug-in's threads
            for _ in range(1000):
                if not plugin.exists_in_put_tasks(k):
                    break
                threading.Event().wait(0.01)
        assert [sm.contains(k) for k in keys] == ["kvtier"] * 3
        got = sm.batched_get(keys, location="kvtier")  # as the engine reads a lookup's hits
        for w, back in zip(want, got):
            assert back is not None and torch.equal(back.tensor[0], w[0])
        assert sm.contains(key(9)) is None
        sm.remove(keys[0])
        assert sm.contains(keys[0]) is None and sm.get(keys[0]) is None
    finally:
        sm.close()


def wait_for(cond: Any, seconds: float = 20.0) -> bool:
    for _ in range(int(seconds * 100)):
        if cond():
            return True
        threading.Event().wait(0.01)
    return cond()


def gate_puts(plugin: KvtierStoragePlugin) -> threading.Event:
    """Holds the plug-in's puts (after encoding) until the event is set."""
    gate, real_put = threading.Event(), plugin.cache.put

    def held_put(*a: Any, **kw: Any) -> Any:
        gate.wait(30)
        return real_put(*a, **kw)
    plugin.cache.put = held_put  # type: ignore[method-assign]
    return gate


def test_closing_the_storage_manager_drains_the_puts_before_lmcache_frees_its_memory(
        tmp_path: Path) -> None:
    """StorageManager.close() closes LocalCPUBackend (whose arena holds the
    objects being stored) before the plug-in: the running put ends first,
    the queued ones are dropped with their references."""
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    cfg = engine_config(f"nvme:{tmp_path}:64MiB", "k16v8", threads=1)
    gc.collect()
    sm = StorageManager(LMCacheEngineConfig.from_dict(cfg), metadata(), EventManager())
    plugin = sm.storage_backends["kvtier"]
    allocator = plugin.local_cpu_backend.memory_allocator
    keys = [key(i) for i in range(6)]
    gate = gate_puts(plugin)
    objs = [chunk(plugin, i) for i in range(6)]
    futures = plugin.batched_submit_put_task(keys, objs)
    for o in objs:  # as StorageManager.batched_put does: the plug-in holds the only reference
        o.ref_count_down()
    in_flight_when_freed: List[int] = []
    real_close = allocator.close

    def spy_close() -> None:
        in_flight_when_freed.append(sum(plugin.exists_in_put_tasks(k) for k in keys))
        gate.set()  # without the fix: let the puts end before the arena goes (no crash)
        wait_for(lambda: not any(plugin.exists_in_put_tasks(k) for k in keys))
        real_close()
    allocator.close = spy_close
    threading.Timer(0.3, gate.set).start()
    sm.close()
    assert in_flight_when_freed == [0]
    assert all(f.done() for f in futures) and futures[0].result() is True
    assert [f.result() for f in futures[1:]] == [False] * 5


def test_objects_of_several_kv_groups_round_trip(tmp_path: Path) -> None:
    """An object of two KV layer groups (LMCacheMetadata.get_shapes() with two
    entries) comes back with both shapes and dtypes and its bytes."""
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8")
    shapes = [torch.Size([2, LAYERS, CHUNK, HEADS * DIM]), torch.Size([2, 1, CHUNK, 64])]
    dtypes = [torch.bfloat16, torch.float16]
    obj = plugin.local_cpu_backend.allocate(shapes, dtypes, MemoryFormat.KV_2LTD)
    g = torch.Generator().manual_seed(3)
    obj.raw_data[:obj.get_size()].copy_(
        torch.randint(0, 256, (obj.get_size(),), generator=g, dtype=torch.uint8))
    want = bytes(obj.byte_array)
    put(plugin, [key(1)], [obj])
    back = plugin.get_blocking(key(1))
    assert back is not None and back.metadata.fmt == MemoryFormat.KV_2LTD
    assert back.metadata.shapes == shapes and back.metadata.dtypes == dtypes
    assert bytes(back.byte_array) == want and plugin.contains(key(1))
    plugin.close()


def test_an_async_lookup_and_load_release_their_pins(tmp_path: Path) -> None:
    """LMCache's async lookup pins the hits (batched_async_contains, pin=True)
    and loads exactly them (batched_get_non_blocking), which unpins them, as
    LocalDiskBackend does; the engine never calls unpin itself."""
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8")
    keys = [key(i) for i in range(3)]
    objs = [chunk(plugin, i) for i in range(3)]
    put(plugin, keys, objs)
    for r in range(3):
        assert asyncio.run(plugin.batched_async_contains(f"r{r}", keys + [key(9)], pin=True)) == 3
        got = asyncio.run(plugin.batched_get_non_blocking(f"r{r}", keys))
        assert [torch.equal(b.tensor[0], o.tensor[0]) for b, o in zip(got, objs)] == [True] * 3
        for b in got:
            b.ref_count_down()
    assert [plugin.remove(k, force=False) for k in keys] == [True] * 3  # nothing pinned
    plugin.close()


def test_an_async_load_with_lmcaches_memory_full_returns_the_hits_so_far(tmp_path: Path) -> None:
    """On LMCache's event loop a load must not wait for memory (busy_loop):
    with room for one chunk, it returns that one hit at once."""
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8", threads=1)
    keys = [key(i) for i in range(3)]
    objs = [chunk(plugin, i) for i in range(3)]
    put(plugin, keys, objs)
    cpu, filler = plugin.local_cpu_backend, []
    shape = objs[0].metadata.shape
    while (o := cpu.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD, eviction=False)):
        filler.append(o)
    filler.pop().ref_count_down()  # room for one chunk
    result: List[Any] = []
    t = threading.Thread(target=lambda: result.append(
        asyncio.run(plugin.batched_get_non_blocking("r", keys))), daemon=True)
    t.start()
    t.join(5)
    hung = t.is_alive()
    for o in filler:  # lets a load that waits for memory end
        o.ref_count_down()
    t.join(30)
    assert not hung
    got = result[0]
    assert len(got) == 1 and torch.equal(got[0].tensor[0], objs[0].tensor[0])
    got[0].ref_count_down()
    plugin.close()


def test_a_closed_plugin_says_so(tmp_path: Path) -> None:
    plugin = open_plugin("dram:64MiB")
    obj = chunk(plugin, 1)
    plugin.close()
    for call in (lambda: plugin.contains(key(1)), lambda: plugin.get_blocking(key(1)),
                 lambda: plugin.batched_submit_put_task([key(1)], [obj])):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert obj.get_ref_count() == 1


def test_a_put_failing_outside_kvtier_is_logged_and_lets_go_of_its_object(
        tmp_path: Path, caplog: Any) -> None:
    plugin = open_plugin("dram:64MiB")
    obj = chunk(plugin, 1)

    def broken_put(*a: Any, **kw: Any) -> None:
        raise RuntimeError("the tier fell over")
    plugin.cache.put = broken_put  # type: ignore[method-assign]
    futures = plugin.batched_submit_put_task([key(1)], [obj])
    assert futures[0].result() is False
    assert "the tier fell over" in caplog.text
    assert obj.get_ref_count() == 1 and not plugin.exists_in_put_tasks(key(1))
    plugin.close()


def test_a_span_that_raises_leaves_no_object_held(tmp_path: Path) -> None:
    """batched_get_blocking reads spans on several threads: when one raises,
    the objects the others (and it) allocated are given back."""
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8", threads=2)
    keys = [key(i) for i in range(8)]
    put(plugin, keys, [chunk(plugin, i) for i in range(8)])
    made: List[Any] = []
    real_allocate, real_decode = plugin._allocate, plugin._decode_codec

    def allocate(*a: Any, **kw: Any) -> Any:
        o = real_allocate(*a, **kw)
        made.append(o)
        return o

    def decode_codec(kk: Any, *a: Any, **kw: Any) -> Any:
        if kk == plugin.kv_key(keys[6], False):
            raise RuntimeError("decoder broke")
        return real_decode(kk, *a, **kw)
    plugin._allocate = allocate  # type: ignore[method-assign]
    plugin._decode_codec = decode_codec  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="decoder broke"):
        plugin.batched_get_blocking(keys)
    assert len(made) == 6 and [o.get_ref_count() for o in made] == [0] * 6
    plugin.close()


def test_gets_do_not_wait_behind_puts(tmp_path: Path) -> None:
    plugin = open_plugin(f"nvme:{tmp_path}:64MiB", "k16v8", threads=2)
    keys = [key(i) for i in range(4)]
    put(plugin, keys, [chunk(plugin, i) for i in range(4)])
    gate = gate_puts(plugin)
    slow = plugin.batched_submit_put_task([key(10), key(11)],
                                          [chunk(plugin, 10), chunk(plugin, 11)])
    result: List[Any] = []
    t = threading.Thread(target=lambda: result.append(plugin.batched_get_blocking(keys)),
                         daemon=True)
    t.start()
    t.join(5)
    waited = t.is_alive()
    gate.set()
    t.join(30)
    assert not waited and all(o is not None for o in result[0])
    assert all(f.result() for f in slow)
    plugin.close()


def test_a_descriptor_whose_length_disagrees_with_its_shape_is_a_miss(tmp_path: Path) -> None:
    """A raw-path payload whose checksums hold but whose descriptor gives a
    length other than its shapes' elements times their size is refused."""
    plugin = open_plugin("dram:64MiB", "k16v8", metadata(torch.float32))
    k = key(1, torch.float32)
    put(plugin, [k], [chunk(plugin, 1, dtype=torch.float32)])
    kk = plugin.kv_key(k, raw=True)
    info = kvtier.inspect(plugin.cache.get(kk))
    src = np.zeros(info.tokens * 256, np.uint8)
    tk, tv = lmc._raw_views(src.ctypes.data, info.tokens, src)
    decode(plugin.cache.get(kk), tk, tv)
    desc = lmc.Descriptor.unpack(src.tobytes())
    bad = dataclasses.replace(desc, nbytes=desc.nbytes - 64).pack()
    src[:len(bad)] = np.frombuffer(bad, np.uint8)
    buf = np.empty(encode_bound("raw", 1, info.tokens, 1, 64), np.uint8)
    n = encode_into(buf, tk, tv, "raw", key=kk, fingerprint=plugin.fingerprint)
    plugin.cache.delete(kk)
    plugin.cache.put(kk, buf[:n])
    assert plugin.get_blocking(k) is None and not plugin.contains(k)
    plugin.close()


def test_two_plugin_instances_keep_their_own_options(tmp_path: Path) -> None:
    extra: Dict[str, Any] = {}
    for name, codec in (("a", "raw"), ("b", "k16v8")):
        extra.update({f"storage_plugin.{name}.module_path": "kvtier.lmcache",
                      f"storage_plugin.{name}.class_name": "KvtierStoragePlugin",
                      f"storage_plugin.{name}.tiers": f"nvme:{tmp_path}/{name}:64MiB",
                      f"storage_plugin.{name}.codec": codec})
    cfg = LMCacheEngineConfig.from_dict({
        "chunk_size": CHUNK, "local_cpu": False, "max_local_cpu_size": 0.05,
        "storage_plugins": ["a", "b"], "extra_config": extra})
    gc.collect()
    cpu = LocalCPUBackend(cfg, metadata(), dst_device="cpu")
    backends: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    storage_plugin_launcher(cfg, metadata(), asyncio.new_event_loop(), cpu, "cpu", backends)
    assert sorted(backends) == ["a", "b"]
    for name, codec in (("a", "raw"), ("b", "k16v8")):
        assert backends[name].tiers == f"nvme:{tmp_path}/{name}:64MiB"
        assert backends[name].options.codec == codec
        backends[name].close()
