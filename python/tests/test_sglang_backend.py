"""kvtier.sglang against SGLang 0.5.23's own classes on CPU: the backend is
built by SGLang's StorageBackendFactory ("dynamic", as --hicache-storage-backend
dynamic does) over SGLang's MHATokenToKVPoolHost, itself built from SGLang's
MHATokenToKVPool on "cpu" the way SGLang's storage unit tests build it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

pytest.importorskip(
    "sglang.srt.mem_cache.hicache_storage",
    reason="SGLang is not installed in this Python; './bootstrap.sh sglang' makes "
    "${KVT_SGLANG_VENV:-~/.cache/kvtier/venv-sglang} with SGLang 0.5.23 and runs these tests "
    "(ctest's test_sglang runs them with that venv)")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import kvtier  # noqa: E402
from kvtier.sglang import KvtierHiCacheStorage, Refused  # noqa: E402

LAYERS, HEADS, DIM, PAGE = 3, 2, 32, 8
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


def make_host(layout: str, dtype: Any = torch.bfloat16, tokens: int = 256) -> Any:
    """SGLang's host pool over SGLang's device pool, both in CPU memory,
    filled with finite random values."""
    dev = MHATokenToKVPool(tokens, PAGE, dtype, HEADS, DIM, LAYERS, "cpu", False,
                           start_layer=0, end_layer=LAYERS)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=LAYERS)
    fill(host, 1)
    return host


def fill(host: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    host.kv_buffer.copy_(torch.randn(host.kv_buffer.shape, generator=g).to(host.kv_buffer.dtype))


def storage_config(extra: Dict[str, Any], tp_rank: int = 0, tp_size: int = 1,
                   mla: bool = False, dp_rank: int = 0) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="test/llama-tiny", dp_rank=dp_rank,
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang",
                      "class_name": "KvtierHiCacheStorage", "interface_v1": 1, **extra})


def open_backend(host: Any, tiers: str, codec: str = "raw", **kw: Any) -> KvtierHiCacheStorage:
    """The backend as SGLang's cache controller makes it (attach_storage_backend)."""
    tp = {k: kw.pop(k) for k in ("tp_rank", "tp_size", "dp_rank") if k in kw}
    cfg = storage_config({"tiers": tiers, "codec": codec, **kw}, **tp)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)
    return backend


def page_kv(host: Any, start: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """K and V of the page at token slot start, as [layers, tokens, heads, dim]
    copies, read with SGLang's own shapes of each layout (init_kv_buffer)."""
    b, p = host.kv_buffer, start // PAGE
    if host.layout == "layer_first":
        k, v = b[0, :, start:start + PAGE], b[1, :, start:start + PAGE]
    elif host.layout == "page_first":
        k, v = b[0, start:start + PAGE].transpose(0, 1), b[1, start:start + PAGE].transpose(0, 1)
    elif host.layout == "page_first_direct":
        k, v = b[0, p], b[1, p]
    else:  # page_head: [head, token, layer, dim]
        k, v = b[0, p].permute(2, 1, 0, 3), b[1, p].permute(2, 1, 0, 3)
    return k.contiguous(), v.contiguous()


def keys(n: int, salt: int = 0) -> List[str]:
    return [f"{salt:08x}{i:056x}" for i in range(1, n + 1)]


def test_sglang_factory_builds_the_backend_from_its_extra_config(tmp_path: Path) -> None:
    host = make_host("page_first")
    backend = open_backend(host, f"nvme:{tmp_path}:64MiB")
    assert type(backend) is KvtierHiCacheStorage
    assert backend.mem_pool_host is host
    backend.close()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("codec", kvtier.PRESETS)
def test_pages_round_trip_through_the_host_pool(tmp_path: Path, layout: str, codec: str) -> None:
    """What batch_get_v1 writes into each page is the codec's decode of that
    page (exactly the page for raw), and no other page is touched."""
    host = make_host(layout)
    backend = open_backend(host, f"nvme:{tmp_path}:64MiB", codec, threads=3)
    n = 6
    idx = host.alloc(n * PAGE)
    ks = keys(n)
    assert backend.batch_set_v1(ks, idx) == [True] * n
    want = []
    for i in range(n):
        k, v = page_kv(host, int(idx[i * PAGE]))
        payload = kvtier.encode(k, v, codec)
        want.append(kvtier.decode(payload, torch.empty_like(k), torch.empty_like(v)))
    host.kv_buffer.zero_()
    assert backend.batch_get_v1(ks, idx) == [True] * n
    for i in range(n):
        k, v = page_kv(host, int(idx[i * PAGE]))
        assert torch.equal(k, want[i][0]) and torch.equal(v, want[i][1]), f"page {i}"
    if codec == "raw":
        fill(host, 1)  # the original values
        for i in range(n):
            ref = page_kv(host, int(idx[i * PAGE]))
            assert torch.equal(ref[0], want[i][0]) and torch.equal(ref[1], want[i][1])
    # Slots outside the pages read stay as they were (zero).
    host.kv_buffer.zero_()
    backend.batch_get_v1(ks[:1], idx[:PAGE])
    rest = host.alloc(PAGE)
    assert not page_kv(host, int(rest[0]))[0].any()
    backend.close()


def test_fp16_pool_round_trips(tmp_path: Path) -> None:
    host = make_host("page_first", torch.float16)
    backend = open_backend(host, "dram:64MiB", "raw")
    idx = host.alloc(2 * PAGE)
    want = [page_kv(host, int(idx[i * PAGE])) for i in range(2)]
    assert backend.batch_set_v1(keys(2), idx) == [True, True]
    host.kv_buffer.zero_()
    assert backend.batch_get_v1(keys(2), idx) == [True, True]
    for i in range(2):
        got = page_kv(host, int(idx[i * PAGE]))
        assert torch.equal(got[0], want[i][0]) and torch.equal(got[1], want[i][1])
    backend.close()


def test_batch_exists_is_the_held_prefix(tmp_path: Path) -> None:
    host = make_host("page_first")
    backend = open_backend(host, f"nvme:{tmp_path}:64MiB")
    ks = keys(5)
    idx = host.alloc(5 * PAGE)
    held = [0, 1, 3, 4]  # page 2 never stored
    sel = torch.cat([idx[i * PAGE:(i + 1) * PAGE] for i in held])
    assert backend.batch_set_v1([ks[i] for i in held], sel) == [True] * 4
    assert backend.batch_exists(ks) == 2
    assert backend.batch_exists(ks[3:]) == 2
    assert backend.batch_exists(ks[2:]) == 0
    assert backend.batch_exists([]) == 0
    assert backend.exists(ks[0]) and not backend.exists(ks[2])
    info = HiCacheStorageExtraInfo(prefix_keys=ks[:3])
    assert backend.batch_exists(ks[3:], info) == 2
    assert backend.batch_get_v1(ks, idx) == [True, True, False, True, True]
    backend.close()


def test_a_page_flipped_on_disk_is_a_miss_and_the_rest_load(tmp_path: Path) -> None:
    host = make_host("page_first")
    backend = open_backend(host, f"nvme:{tmp_path}:64MiB", "k16v8")
    ks = keys(4)
    idx = host.alloc(4 * PAGE)
    assert all(backend.batch_set_v1(ks, idx))
    victim = backend.keys_of(ks[1:2])[0].hex()
    path = next(p for p in tmp_path.rglob(victim))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    assert backend.batch_get_v1(ks, idx) == [True, False, True, True]
    backend.close()


def test_a_payload_failing_its_checksum_is_a_miss_and_deleted(tmp_path: Path) -> None:
    """A payload that the tier serves but whose section checksum fails (a
    DRAM tier does not hash what it holds) is a miss, and is deleted so the
    recomputed page is stored again."""
    host = make_host("page_first")
    backend = open_backend(host, "dram:64MiB", "int8")
    ks = keys(3)
    idx = host.alloc(3 * PAGE)
    assert all(backend.batch_set_v1(ks, idx))
    cache = backend.cache
    key = backend.keys_of(ks[1:2])[0]
    payload = bytearray(cache.get(key))
    sec = kvtier.sections(bytes(payload))[-1]
    payload[sec.offset + sec.stored_size // 2] ^= 0x01
    cache.delete(key)
    cache.put(key, bytes(payload))  # the header is fine: the cache takes it
    assert backend.batch_get_v1(ks, idx) == [True, False, True]
    assert backend.batch_exists(ks) == 1  # deleted
    assert backend.batch_set_v1(ks, idx) == [True] * 3  # stored again
    assert backend.batch_get_v1(ks, idx) == [True] * 3
    backend.close()


def test_tensor_parallel_ranks_keep_their_own_payloads(tmp_path: Path) -> None:
    tiers = f"nvme:{tmp_path}/r{{rank}}:64MiB"
    hosts = [make_host("page_first") for _ in range(2)]
    fill(hosts[1], 2)
    backends = [open_backend(h, tiers, tp_rank=r, tp_size=2) for r, h in enumerate(hosts)]
    assert (tmp_path / "r0").is_dir() and (tmp_path / "r1").is_dir()
    ks = keys(2)
    idx = [h.alloc(2 * PAGE) for h in hosts]
    want = [page_kv(h, int(i[0])) for h, i in zip(hosts, idx)]
    assert not torch.equal(want[0][0], want[1][0])
    for b, i in zip(backends, idx):
        assert b.batch_set_v1(ks, i) == [True, True]
    assert backends[0].keys_of(ks) != backends[1].keys_of(ks)
    for b, h, i, w in zip(backends, hosts, idx, want):
        h.kv_buffer.zero_()
        assert b.batch_get_v1(ks, i) == [True, True]
        assert torch.equal(page_kv(h, int(i[0]))[0], w[0])
    for b in backends:
        b.close()


def test_pages_survive_a_restart_on_nvme(tmp_path: Path) -> None:
    host = make_host("layer_first")
    backend = open_backend(host, f"nvme:{tmp_path}:64MiB", "fp8")
    idx = host.alloc(2 * PAGE)
    assert all(backend.batch_set_v1(keys(2), idx))
    backend.close()
    again = open_backend(host, f"nvme:{tmp_path}:64MiB", "fp8")
    assert again.batch_exists(keys(2)) == 2
    # Another codec is another fingerprint: none of these pages is its.
    other = open_backend(make_host("layer_first"), f"nvme:{tmp_path}/b:64MiB", "int4")
    assert other.keys_of(keys(1)) != again.keys_of(keys(1))
    again.close()
    other.close()


def test_what_the_backend_refuses(tmp_path: Path) -> None:
    host = make_host("page_first")
    with pytest.raises(Refused, match="MLA"):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config({"tiers": "dram:1MiB"}, mla=True), host)
    cfg = storage_config({"tiers": "dram:1MiB"})
    del cfg.extra_config["interface_v1"]
    with pytest.raises(Refused, match="interface_v1"):
        StorageBackendFactory.create_backend("dynamic", cfg, host)
    with pytest.raises(Refused, match="no tiers"):
        StorageBackendFactory.create_backend("dynamic", storage_config({}), host)
    with pytest.raises(Refused, match="rank"):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config({"tiers": f"nvme:{tmp_path}:1MiB"}, tp_size=2), host)
    with pytest.raises(kvtier.Error):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config({"tiers": "dram:1MiB", "codec": "nope"}), host)
    backend = StorageBackendFactory.create_backend(
        "dynamic", storage_config({"tiers": "dram:1MiB"}), host)
    host32 = make_host("page_first")
    host32.dtype = torch.float32
    with pytest.raises(Refused, match="float32"):
        backend.register_mem_pool_host(host32)
    with pytest.raises(Refused, match="interface_v1"):
        backend.get("k")
    # A hybrid model's sidecar pool, as HybridCacheController registers it.
    with pytest.raises(Refused, match="hybrid models"):
        backend.register_mem_host_pool_v2(make_host("page_first"), "mamba")


def test_host_indices_must_cover_whole_pages(tmp_path: Path) -> None:
    host = make_host("page_first")
    backend = open_backend(host, "dram:16MiB")
    idx = host.alloc(2 * PAGE)
    with pytest.raises(ValueError, match="host indices"):
        backend.batch_set_v1(keys(3), idx)
    assert backend.batch_set_v1([], idx[:0]) == []
    backend.close()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q", *os.sys.argv[1:]]))


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_a_full_tier_takes_every_page_with_several_threads(tmp_path: Path, tier: str) -> None:
    """Batches stored on 4 threads into a tier that holds a few pages: each
    page evicts older ones, so every page of every batch is stored (a page
    stored before the page it chains to used to be an orphan, which evicts
    nothing: a full tier refused it and SGLang's backup stopped there)."""
    host = make_host("page_first", tokens=1024)
    spec = "dram:2MiB" if tier == "dram" else f"nvme:{tmp_path}:2MiB"
    backend = open_backend(host, spec, "raw", threads=4)
    idx = host.alloc(40 * PAGE)
    refused = 0
    for r in range(12):
        refused += backend.batch_set_v1(keys(40, salt=r + 1), idx).count(False)
    assert refused == 0
    backend.close()


def test_metrics_get_sglangs_own_storage_metrics(tmp_path: Path) -> None:
    """get_stats() is None, so SGLang's --enable-metrics makes its own
    StorageMetrics (it assigns fields to what the backend returns);
    kvtier's counters are kvtier_stats()."""
    host = make_host("page_first")
    backend = open_backend(host, f"nvme:{tmp_path}:64MiB")
    assert backend.get_stats() is None
    idx = host.alloc(2 * PAGE)
    assert all(backend.batch_set_v1(keys(2), idx))
    assert backend.kvtier_stats().puts >= 2
    backend.close()


def test_data_parallel_replicas_get_their_own_directories(tmp_path: Path) -> None:
    """With DP attention every replica's attention rank 0 is tp_rank 0: "{rank}"
    names the replica too, so each opens its own nvme directory; the parent
    directories of the spec are made."""
    tiers = f"nvme:{tmp_path}/deep/er/r{{rank}}:64MiB"
    b0 = open_backend(make_host("page_first"), tiers, dp_rank=0)
    b1 = open_backend(make_host("page_first"), tiers, dp_rank=1)
    assert b0.tiers != b1.tiers
    assert (tmp_path / "deep/er/r0").is_dir() and (tmp_path / "deep/er/r0-dp1").is_dir()
    b0.close()
    b1.close()
