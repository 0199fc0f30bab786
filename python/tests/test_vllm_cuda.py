"""The plug-in worker's CUDA device (kvtier.vllm.cuda.CudaDevice over
kvtier.gpu.PagedKV) on a GPU, in vLLM 0.33's layout (vllm_layout): what the
worker asks of it - a chunk stored after the engine's event into its host
buffer gives kvtier.encode()'s bytes, a load into other blocks that starts
inside the chunk (-1 blocks) writes kvtier.decode()'s values there and
nothing else, a corrupt or foreign payload raises before anything is
written. vLLM is not needed (its wheel cannot travel to the GPU machine).
Skips without torch, a CUDA device or a CUDA build of libkvtier."""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pytest
import vllm_layout

import kvtier
from kvtier import ErrorCode

torch = pytest.importorskip("torch", reason="the device tests need torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not kvtier.has_feature("cuda"):
    pytest.skip("libkvtier was built without CUDA (KVT_ENABLE_CUDA)", allow_module_level=True)

from kvtier.vllm.config import CacheShape, model_fingerprint  # noqa: E402
from kvtier.vllm.cuda import CudaDevice  # noqa: E402

L, H, N, D, BLOCKS = 4, 8, 16, 128, 24
SHAPE = CacheShape(layers=L, kv_heads=H, head_dim=D, dtype="bf16", block_size=N,
                   num_blocks=BLOCKS, layer_names=tuple(f"l{i}" for i in range(L)))
FP = model_fingerprint("m", SHAPE, "k16v8", 0, 1)


def make_views(layout: str = "LBNHC") -> Tuple[Any, List[Any]]:
    raw, views = vllm_layout.torch_layer_views(torch, layout, L, BLOCKS, H, N, D,
                                               torch.bfloat16, "cuda")
    g = torch.Generator(device="cuda").manual_seed(3)
    for v in views:
        v.copy_(torch.randn(v.shape, device="cuda", generator=g).to(torch.bfloat16))
    return raw, views


def gather(views: List[Any], ids: List[int]) -> Tuple[np.ndarray, np.ndarray]:
    idx = torch.as_tensor(ids, device="cuda")
    ks, vs = [], []
    for v in views:
        x = v.index_select(0, idx).transpose(1, 2).reshape(-1, H, 2 * D)
        x = x.view(torch.int16).cpu().numpy().view(np.uint16)
        ks.append(x[..., :D])
        vs.append(x[..., D:])
    return np.ascontiguousarray(np.stack(ks)), np.ascontiguousarray(np.stack(vs))


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
def test_cuda_device_store_is_encode_and_a_partial_load_is_decode(layout: str) -> None:
    raw, views = make_views(layout)
    dev = CudaDevice(views, SHAPE, "k16v8", FP)
    key = kvtier.Key(b"c" * 16)
    buf = dev.host_buffer(1 << 20)
    n = dev.store([5, 2, 9, 11], buf, key=key, after=dev.mark())
    payload = bytes(buf[:n])
    k, v = gather(views, [5, 2, 9, 11])
    assert payload == kvtier.encode(k, v, "k16v8", dtype="bf16", key=key, fingerprint=FP)
    untouched = [b for b in range(BLOCKS) if b not in (20, 21, 22)]
    before = gather(views, untouched)
    dev.load(buf[:n], [-1, 20, 21, 22], key=key)  # the chunk's first block is not loaded
    k_dec, v_dec = kvtier.decode(payload)
    k_dst, v_dst = gather(views, [20, 21, 22])
    assert np.array_equal(k_dst, k_dec[:, N:]) and np.array_equal(v_dst, v_dec[:, N:])
    assert np.array_equal(k_dst, k[:, N:]), "K is not bit-exact"
    assert all(np.array_equal(a, b) for a, b in zip(before, gather(views, untouched)))


def test_cuda_device_refuses_corrupt_and_foreign_payloads_writing_nothing() -> None:
    raw, views = make_views()
    dev = CudaDevice(views, SHAPE, "k16v8", FP)
    key = kvtier.Key(b"d" * 16)
    buf = dev.host_buffer(1 << 20)
    n = dev.store([1, 2], buf, key=key, after=None)
    torch.cuda.synchronize()
    before = raw.clone()
    buf[n - 100] ^= 0x10
    with pytest.raises(kvtier.Error) as e:
        dev.load(buf[:n], [7, 8], key=key)
    assert e.value.code == ErrorCode.ECHECKSUM
    buf[n - 100] ^= 0x10
    other = CudaDevice(views, SHAPE, "k16v8", model_fingerprint("other", SHAPE, "k16v8", 0, 1))
    with pytest.raises(kvtier.Error) as e:
        other.load(buf[:n], [7, 8], key=key)
    assert e.value.code == ErrorCode.EFOREIGN
    with pytest.raises(kvtier.Error) as e:
        dev.load(buf[:n], [7, 8], key=kvtier.Key(b"x" * 16))
    assert e.value.code == ErrorCode.EFOREIGN
    torch.cuda.synchronize()
    assert torch.equal(raw, before)
    dev.load(buf[:n], [7, 8], key=key)  # the intact payload still loads
    assert np.array_equal(gather(views, [7, 8])[0], gather(views, [1, 2])[0])


def test_cuda_device_store_grows_into_a_bigger_buffer() -> None:
    raw, views = make_views()
    dev = CudaDevice(views, SHAPE, "raw", FP)
    small = dev.host_buffer(4096)
    with pytest.raises(kvtier.Error) as e:
        dev.store([0, 1], small, key=kvtier.Key(b"e" * 16), after=None)
    assert e.value.code == ErrorCode.ENOBUFS
    big = dev.host_buffer(1 << 21)
    assert dev.store([0, 1], big, key=kvtier.Key(b"e" * 16), after=None) > 4096


# --- the worker over the CUDA device ------------------------------------------------

@pytest.fixture(scope="module")
def worker_classes() -> Any:
    from vllm_stand_in import install_vllm_stand_in

    install_vllm_stand_in()  # vLLM's own module where it is installed
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    from kvtier.vllm.manager import KvtierLoadSpec, KvtierStoreSpec
    from kvtier.vllm.worker import KvtierWorker
    return GPULoadStoreSpec, KvtierStoreSpec, KvtierLoadSpec, KvtierWorker


@pytest.mark.parametrize("tiers", ["dram:64MiB", "dram:64MiB,pin=off", "nvme"])
def test_worker_on_cuda_restores_chunks_through_each_kind_of_tier(worker_classes, tiers: str,
                                                                  tmp_path) -> None:
    """dram (pinned slabs): payloads are stored into reserved blocks and lent
    in place to loads; dram with pin=off: lent pageable bytes go through the
    thread's pinned buffer; nvme: copied into it. A corrupt chunk is a failed load that
    names it and every block from it on, and writes none of its blocks."""
    GPULoadStoreSpec, KvtierStoreSpec, KvtierLoadSpec, KvtierWorker = worker_classes
    raw, views = make_views()
    spec = f"nvme:{tmp_path}/n:64MiB" if tiers == "nvme" else tiers
    cache = kvtier.Cache(spec, fingerprint=FP, chunk_tokens=2 * N)
    w = KvtierWorker(CudaDevice(views, SHAPE, "k16v8", FP, threads=4), cache, FP,
                     chunk_tokens=2 * N, blocks_per_chunk=2, threads=4)
    try:
        okeys = [bytes([i]) * 32 + bytes(4) for i in range(4)]
        src = [3, 1, 4, 0, 5, 9, 2, 6]
        assert w.submit_store(1, GPULoadStoreSpec(src, group_sizes=[8], block_indices=[0]),
                              KvtierStoreSpec(okeys, [None] + okeys[:-1]))
        w.wait({1})
        (res,) = w.get_finished()
        assert res.success, w.stats
        # Pinned dram: the store kernel wrote into blocks reserved in the tier.
        # Pageable dram (the kernel cannot write it) and nvme (cannot reserve):
        # through the thread's pinned buffer and a put.
        assert w._reserving == (tiers == "dram:64MiB")
        dst = [10, 11, 12, 13, 14, 15, 16, 17]
        assert w.submit_load(2, KvtierLoadSpec(okeys), GPULoadStoreSpec(dst, group_sizes=[8],
                                                                        block_indices=[0]))
        w.wait({2})
        (res,) = w.get_finished()
        assert res.success, w.stats
        k_src, _ = gather(views, src)
        k_dst, v_dst = gather(views, dst)
        assert np.array_equal(k_dst, k_src), "K is not bit-exact"
        k_dec, v_dec = kvtier.decode(cache.get(w.key(okeys[1])))
        assert np.array_equal(v_dst[:, 2 * N:4 * N], v_dec)  # chunk 1 is decode()'s values
        # Chunk 2 corrupt (a section byte; put checks only the header).
        key2 = w.key(okeys[2])
        bad = bytearray(cache.get(key2))
        bad[-100] ^= 0x10
        cache.delete(key2)
        cache.put(key2, bytes(bad))
        dst2 = [18, 19, 20, 21, 22, 23]
        before = gather(views, [22, 23])  # chunk 2's blocks
        assert w.submit_load(3, KvtierLoadSpec(okeys[:3]),
                             GPULoadStoreSpec(dst2, group_sizes=[6], block_indices=[0]))
        w.wait({3})
        (res,) = w.get_finished()
        assert not res.success and res.failed_keys == [okeys[2]]
        assert res.invalid_block_ids == [22, 23]
        assert w.stats.reasons == {"KVT_ECHECKSUM": 1}
        after = gather(views, [22, 23])
        assert all(np.array_equal(a, b) for a, b in zip(before, after)), "wrote a corrupt chunk"
        assert key2 not in cache and cache.stats().pinned == 0
    finally:
        w.shutdown()
