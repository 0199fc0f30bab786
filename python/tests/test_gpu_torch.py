"""kvtier.gpu on a GPU, against torch CUDA tensors in vLLM 0.33's exact
layout (vllm_layout: create_kv_cache_views' strides): a store of shuffled
block ids gives kvtier.encode()'s bytes for the same K/V, a load into other
block ids writes kvtier.decode()'s values of the payload (bit-exact K for
k16v8, everything for raw) and nothing else, through pinned host buffers,
device payloads and a kvtier cache; per-layer events; a corrupt payload is
refused with kvtier.Error before anything is written; fp8 and MLA caches are
refused. Skips without torch, a CUDA device or a CUDA build of libkvtier."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
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

import kvtier.gpu as kg  # noqa: E402

L, H, N, D = 4, 8, 16, 128  # layers, KV heads, block size, head dim (Llama-3.1-8B's shape)
BLOCKS = 40
CODECS = ("raw", "k16v8", "fp8", "int4", "k8v4")


def make_cache(layout: str = "LBNHC", dtype: Any = torch.bfloat16, layers: int = L,
               seed: int = 1, **kw: Any) -> Tuple[Any, List[Any]]:
    raw, views = vllm_layout.torch_layer_views(torch, layout, layers, BLOCKS, H, N, D, dtype,
                                               "cuda", **kw)
    g = torch.Generator(device="cuda").manual_seed(seed)
    for v in views:  # per-row magnitudes 2^-6 .. 2^6
        mag = torch.exp2(torch.randint(-6, 7, v.shape[:-1] + (1,), device="cuda",
                                       generator=g).float())
        v.copy_((torch.randn(v.shape, device="cuda", generator=g) * mag).to(dtype))
    return raw, views


def gather(views: List[Any], ids: Any) -> Tuple[np.ndarray, np.ndarray]:
    """K and V of the blocks `ids` as [layers, tokens, heads, head_dim] uint16 bits."""
    idx = torch.as_tensor(np.asarray(ids), device="cuda")
    ks, vs = [], []
    for v in views:
        x = v.index_select(0, idx).transpose(1, 2)  # [blocks, N, H, 2D]
        x = x.reshape(-1, H, 2 * D).view(torch.int16).cpu().numpy().view(np.uint16)
        ks.append(x[..., :D])
        vs.append(x[..., D:])
    return np.ascontiguousarray(np.stack(ks)), np.ascontiguousarray(np.stack(vs))


def shuffled_ids(n: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(BLOCKS)
    return perm[:n], perm[n:2 * n]


# raw and k16v8 on all six layouts, every codec on three of them.
COMBOS = [(lay, c) for lay in kg.VLLM_LAYOUTS for c in CODECS
          if c in ("raw", "k16v8") or lay in ("LBNHC", "LBHNC", "BLNHC")]


@pytest.mark.parametrize("layout,codec", COMBOS)
def test_store_is_encode_and_load_is_decode_in_vllm_layout(layout: str, codec: str) -> None:
    raw, views = make_cache(layout)
    src, dst = shuffled_ids(8, seed=len(layout) + len(codec))
    kv = kg.PagedKV(views)
    assert (kv.num_blocks, kv.heads, kv.block_size, kv.head_dim) == (BLOCKS, H, N, D)
    key, fp = kvtier.Key(b"k" * 16), kvtier.Key(b"f" * 16)
    tokens = len(src) * N
    buf = kg.PinnedBuffer(kv.store_bound(tokens, codec))
    n = kv.store(src, buf, codec=codec, key=key, fingerprint=fp, token_begin=32)
    payload = bytes(buf.array[:n])
    k_src, v_src = gather(views, src)
    want = kvtier.encode(k_src, v_src, codec, dtype="bf16", key=key, fingerprint=fp,
                         token_begin=32)
    assert payload == want, "the GPU store is not the CPU encoder's bytes"
    others = [b for b in range(BLOCKS) if b not in set(dst)]
    untouched = gather(views, others)
    t = kv.load(buf, dst, length=n, expect_key=key, expect_fingerprint=fp)
    t.wait()
    assert t.done()
    k_dst, v_dst = gather(views, dst)
    k_dec, v_dec = kvtier.decode(payload)
    assert np.array_equal(k_dst, k_dec) and np.array_equal(v_dst, v_dec)
    if codec in ("raw", "k16v8"):
        assert np.array_equal(k_dst, k_src), "K is not bit-exact"
    if codec == "raw":
        assert np.array_equal(v_dst, v_src)
    # Nothing but the destination blocks changed.
    assert all(np.array_equal(a, b) for a, b in zip(untouched, gather(views, others)))
    kv.close()
    buf.close()


def test_fp16_and_padded_pages_and_canonical_pages() -> None:
    page = H * N * 2 * D * 2
    raw, views = make_cache("LBNHC", dtype=torch.float16, page_size_padded=page + 512)
    assert views[0].stride(0) == (page + 512) // 2
    # The worker of vLLM's OffloadingConnector sees (num_blocks, page) pages.
    pages = [vllm_layout.canonical_pages(torch, v, BLOCKS, page) for v in views]
    again = [kg.vllm_layer_view(p, layout="NHD", num_kv_heads=H, block_size=N, head_size=D,
                                dtype=torch.float16) for p in pages]
    for a, b in zip(views, again):
        assert a.data_ptr() == b.data_ptr() and a.stride() == b.stride()
        assert a.shape == b.shape
    kv = kg.PagedKV(again)
    src, dst = shuffled_ids(5, seed=7)
    buf = kg.PinnedBuffer(kv.store_bound(5 * N, "k16v8"))
    n = kv.store(src, buf, codec="k16v8")
    kv.load(buf, dst, length=n).wait()
    k_src, _ = gather(views, src)
    k_dst, v_dst = gather(views, dst)
    k_dec, v_dec = (a.view(np.uint16) for a in kvtier.decode(bytes(buf.array[:n])))
    assert np.array_equal(k_dst, k_src)
    assert np.array_equal(v_dst, v_dec) and np.array_equal(k_dst, k_dec)
    with pytest.raises(kvtier.Error) as e:
        kg.vllm_layer_view(pages[0], layout="LHBNC", num_kv_heads=H, block_size=N,
                           head_size=D, dtype=torch.float16)
    assert e.value.code == ErrorCode.ENOTSUP


def test_corrupt_payload_is_refused_before_anything_is_written() -> None:
    raw, views = make_cache()
    kv = kg.PagedKV(views)
    src, dst = shuffled_ids(4, seed=3)
    buf = kg.PinnedBuffer(kv.store_bound(4 * N, "k16v8"))
    n = kv.store(src, buf, codec="k16v8")
    before = raw.clone()
    buf.array[n - 100] ^= 0x10  # a byte of the last section
    with pytest.raises(kvtier.Error) as e:
        kv.load(buf, dst, length=n)
    assert e.value.code == ErrorCode.ECHECKSUM and "checksum" in e.value.detail
    torch.cuda.synchronize()
    assert torch.equal(raw, before)
    buf.array[n - 100] ^= 0x10
    # The same bytes in device memory: checked by the GPU's XXH3.
    dev = torch.from_numpy(buf.array[:n].copy()).cuda()
    dev[n - 100] ^= 0x10
    with pytest.raises(kvtier.Error) as e:
        kv.load(dev, dst)
    assert e.value.code == ErrorCode.ECHECKSUM
    torch.cuda.synchronize()
    assert torch.equal(raw, before)
    # Other refusals: a payload of another chunk, a truncated one, pageable memory.
    with pytest.raises(kvtier.Error) as e:
        kv.load(buf, dst, length=n, expect_key=kvtier.Key(b"x" * 16))
    assert e.value.code == ErrorCode.EFOREIGN
    with pytest.raises(kvtier.Error) as e:
        kv.load(buf, dst, length=n - 1)
    assert e.value.code == ErrorCode.ETRUNC
    with pytest.raises(kvtier.Error) as e:
        kv.load(bytearray(buf.array[:n]), dst)
    assert e.value.code == ErrorCode.ENOTSUP
    with pytest.raises(kvtier.Error) as e:  # 3 blocks: not the payload's 64 tokens
        kv.load(buf, dst[:3], length=n)
    assert e.value.code == ErrorCode.ESHAPE
    with pytest.raises(ValueError):
        kv.load(buf, [BLOCKS], length=n)


def test_device_payloads_layer_events_and_side_streams() -> None:
    raw, views = make_cache("LBHNC")
    kv = kg.PagedKV(views, store_handles=1)
    src, dst = shuffled_ids(6, seed=11)
    cap = kv.store_bound(6 * N, "fp8")
    out = torch.empty(cap, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    job = kv.store_async(src, out, codec="fp8", stream=side)
    with pytest.raises(RuntimeError, match="finish"):
        kv.store_async(src, out, codec="fp8", stream=side)
    n = job.finish()
    assert n == cap
    host = out.cpu().numpy().tobytes()
    info = kvtier.verify(host)  # sealed by the GPU's XXH3 kernels
    assert (info.codec, info.tokens, info.layers) == (kvtier.CodecSpec("fp8"), 6 * N, L)
    events = [torch.cuda.Event() for _ in range(L)]
    t = kv.load(out, dst, layer_events=events, stream=side)
    for ev in events:
        ev.synchronize()
    t.wait()
    k_dst, v_dst = gather(views, dst)
    k_dec, v_dec = kvtier.decode(host)
    assert np.array_equal(k_dst, k_dec) and np.array_equal(v_dst, v_dec)
    # Layers 2..3 only, of a pinned copy, with events waited on by another stream.
    buf = kg.PinnedBuffer(n)
    buf.array[:] = np.frombuffer(host, np.uint8)
    raw.zero_()
    ev2 = [torch.cuda.Event(), torch.cuda.Event()]
    kv.load(buf, dst, layer_first=2, layer_events=ev2)
    ev2[1].wait(side)
    side.synchronize()
    k_dst, v_dst = gather(views, dst)
    assert np.array_equal(k_dst[2:], k_dec[2:]) and not k_dst[:2].any()
    with pytest.raises(ValueError):
        kv.load(buf, dst, layer_count=1, layer_events=ev2)


def test_loads_verified_on_the_gpu_restore_and_refuse_corruption() -> None:
    """verify_on_gpu: the GPU computes the section checksums as the payload
    moves; a clean payload restores what a host-verified load does, from
    pinned and from device memory (also through load_many), and a flipped
    section byte makes wait() raise KVT_ECHECKSUM with nothing written (one
    staged piece here)."""
    raw, views = make_cache()
    kv = kg.PagedKV(views)
    src, dst = shuffled_ids(4, seed=5)
    buf = kg.PinnedBuffer(kv.store_bound(4 * N, "k16v8"))
    n = kv.store(src, buf, codec="k16v8")
    torch.cuda.synchronize()
    base = raw.clone()
    kv.load(buf, dst, length=n).wait()
    want = raw.clone()
    assert not torch.equal(want, base)
    dev = torch.from_numpy(buf.array[:n].copy()).cuda()
    for payload in (buf, dev):
        raw.copy_(base)
        kv.load(payload, dst, length=n, verify_on_gpu=True).wait()
        assert torch.equal(raw, want)
    raw.copy_(base)
    kv.load_many([buf, dev], [dst, dst], lengths=[n, n], verify_on_gpu=True).wait()
    assert torch.equal(raw, want)
    raw.copy_(base)
    before = raw.clone()
    for payload in (buf.array, dev):
        payload[n - 100] ^= 0x10  # a byte of the last section
        t = kv.load(buf if payload is buf.array else dev, dst, length=n, verify_on_gpu=True)
        with pytest.raises(kvtier.Error) as e:
            t.wait()
        assert e.value.code == ErrorCode.ECHECKSUM and "computed on the GPU" in e.value.detail
        torch.cuda.synchronize()
        assert torch.equal(raw, before)
        payload[n - 100] ^= 0x10


def test_through_a_cache_hits_misses_and_corruption() -> None:
    raw, views = make_cache("BLNHC")
    kv = kg.PagedKV(views)
    fp = kvtier.Key(b"F" * 16)
    src, dst = shuffled_ids(16, seed=5)
    buf = kg.PinnedBuffer(kv.store_bound(16 * N, "int4"))
    with kvtier.Cache("dram:64MiB", fingerprint=fp) as cache:
        key = kvtier.chunk_key(fp, range(16 * N))
        n = kv.store_to_cache(cache, key, src, buf, codec="int4")
        assert cache.query(key)[0] == n
        buf.array[:] = 0
        t = kv.load_from_cache(cache, key, dst, buf)
        assert t is not None
        t.wait()
        k_dst, v_dst = gather(views, dst)
        k_dec, v_dec = kvtier.decode(cache.get(key))
        assert np.array_equal(k_dst, k_dec) and np.array_equal(v_dst, v_dec)
        assert kv.load_from_cache(cache, kvtier.Key(b"m" * 16), dst, buf) is None


def test_many_stores_seal_in_parallel_and_many_loads_verify_in_parallel() -> None:
    raw, views = make_cache("LBNHC")
    kv = kg.PagedKV(views, store_handles=3)
    chunks = 7
    src, dst = shuffled_ids(2 * chunks, seed=13)
    src_c = [src[2 * i:2 * i + 2] for i in range(chunks)]
    dst_c = [dst[2 * i:2 * i + 2] for i in range(chunks)]
    cap = (kv.store_bound(2 * N, "k16v8") + 4095) // 4096 * 4096
    arena = kg.PinnedBuffer(cap * chunks)
    outs = [arena.array[i * cap:(i + 1) * cap] for i in range(chunks)]
    keys = [kvtier.Key(bytes([i]) * 16) for i in range(chunks)]
    lens = kv.store_many(src_c, outs, keys=keys, token_begins=[32 * i for i in range(chunks)],
                         codec="k16v8")
    assert len(lens) == chunks
    for i in range(chunks):
        info = kvtier.verify(outs[i][:lens[i]])
        assert info.key == keys[i] and info.token_begin == 32 * i
    t = kv.load_many(outs, dst_c, lengths=lens, keys=keys, threads=3)
    t.wait()
    for i in range(chunks):
        k_dst, v_dst = gather(views, dst_c[i])
        k_dec, v_dec = kvtier.decode(bytes(outs[i][:lens[i]]))
        assert np.array_equal(k_dst, k_dec) and np.array_equal(v_dst, v_dec)
        assert np.array_equal(k_dst, gather(views, src_c[i])[0])
    # One damaged payload in the middle: an Error naming the checksum; the
    # ones before it are loaded, nothing from it on.
    raw.zero_()
    outs[4][lens[4] - 50] ^= 1
    with pytest.raises(kvtier.Error) as e:
        kv.load_many(outs, dst_c, lengths=lens, keys=keys)
    assert e.value.code == ErrorCode.ECHECKSUM
    torch.cuda.synchronize()
    for i in range(chunks):
        k_dst, v_dst = gather(views, dst_c[i])
        if i < 4:
            assert np.array_equal(k_dst, kvtier.decode(bytes(outs[i][:lens[i]]))[0])
        else:
            assert not k_dst.any() and not v_dst.any(), i
    # A wrong key is refused the same way.
    outs[4][lens[4] - 50] ^= 1
    with pytest.raises(kvtier.Error) as e:
        kv.load_many(outs, dst_c, lengths=lens, keys=keys[::-1])
    assert e.value.code == ErrorCode.EFOREIGN


def test_load_many_verified_on_the_gpu_batches_chunks_and_names_a_bad_one() -> None:
    """load_many(verify_on_gpu=True) of pinned chunks of one geometry goes
    through kvt_gpu_load_batch: it restores what the decode gives; a
    flipped byte in one chunk makes wait() raise KVT_ECHECKSUM naming that
    chunk while the others are loaded; chunks of another geometry (the last
    one in another codec) still load, one call each."""
    raw, views = make_cache("LBNHC", seed=3)
    kv = kg.PagedKV(views)
    chunks = 20
    src, dst = shuffled_ids(chunks, seed=17)
    src_c = [src[i:i + 1] for i in range(chunks)]
    dst_c = [dst[i:i + 1] for i in range(chunks)]
    cap = (kv.store_bound(N, "k16v8") + 4095) // 4096 * 4096  # room for either codec
    arena = kg.PinnedBuffer(cap * chunks)
    outs = [arena.array[i * cap:(i + 1) * cap] for i in range(chunks)]
    keys = [kvtier.Key(bytes([i + 1]) * 16) for i in range(chunks)]
    lens = kv.store_many(src_c, outs, keys=keys, codec="int4")
    want = [kvtier.decode(bytes(outs[i][:lens[i]])) for i in range(chunks)]
    kv.load_many(outs, dst_c, lengths=lens, keys=keys, verify_on_gpu=True).wait()
    for i in range(chunks):
        k_dst, v_dst = gather(views, dst_c[i])
        assert np.array_equal(k_dst, want[i][0]) and np.array_equal(v_dst, want[i][1])
    raw.zero_()
    outs[7][lens[7] - 40] ^= 4  # the last section of chunk 7
    t = kv.load_many(outs, dst_c, lengths=lens, keys=keys, verify_on_gpu=True)
    with pytest.raises(kvtier.Error) as e:
        t.wait()
    assert e.value.code == ErrorCode.ECHECKSUM and "load_many payload 7:" in e.value.detail
    with pytest.raises(kvtier.Error):
        t.wait()  # every time
    for i in range(chunks):
        if i != 7:
            assert np.array_equal(gather(views, dst_c[i])[0], want[i][0]), i
    outs[7][lens[7] - 40] ^= 4
    # The last chunk in another codec: another geometry, loaded one by one.
    n_last = kv.store(src_c[-1], outs[-1], codec="k16v8", key=keys[-1])
    raw.zero_()
    kv.load_many(outs, dst_c, lengths=lens[:-1] + [n_last], keys=keys,
                 verify_on_gpu=True).wait()
    k_last, v_last = gather(views, dst_c[-1])
    dec = kvtier.decode(bytes(outs[-1][:n_last]))
    assert np.array_equal(k_last, dec[0]) and np.array_equal(v_last, dec[1])
    assert np.array_equal(gather(views, dst_c[0])[0], want[0][0])


def test_fp8_mla_and_mixed_layers_are_refused() -> None:
    _, views = make_cache()
    fp8 = [v.view(torch.uint8)[..., : 2 * D].view(torch.float8_e4m3fn) for v in views]
    with pytest.raises(kvtier.Error) as e:
        kg.PagedKV(fp8)
    assert e.value.code == ErrorCode.ENOTSUP and "fp8" in e.value.detail
    with pytest.raises(kvtier.Error) as e:  # 256 elements per token: MLA's latent, not 2 x 128
        kg.PagedKV(views, head_dim=2 * D)
    assert e.value.code == ErrorCode.ENOTSUP and "MLA" in e.value.detail
    with pytest.raises(kvtier.Error) as e:
        kg.PagedKV([views[0], views[1][:, :4]])
    assert e.value.code == ErrorCode.ESHAPE
    with pytest.raises(TypeError):
        kg.PagedKV([views[0].cpu()])


def test_loads_from_several_threads_share_the_load_handles() -> None:
    """load_handles=2 and 4 threads: each thread's loads on its own stream
    take whichever load handle is free; every chunk lands where it should."""
    raw, views = make_cache()
    kv = kg.PagedKV(views, load_handles=2, staging_bytes=4 << 20)
    src, dst = shuffled_ids(8, seed=21)
    bufs = []
    for i in range(4):
        b = kg.PinnedBuffer(kv.store_bound(2 * N, "raw"))
        kv.store(src[2 * i:2 * i + 2], b, codec="raw")
        bufs.append(b)

    def load(i: int) -> None:
        s = torch.cuda.Stream()
        for _ in range(5):
            kv.load(bufs[i], dst[2 * i:2 * i + 2], stream=s).wait()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(load, range(4)))
    torch.cuda.synchronize()
    for v in views:
        assert torch.equal(v[torch.as_tensor(dst)], v[torch.as_tensor(src)])
