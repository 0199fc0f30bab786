#!/usr/bin/env python3
"""bench/vllm_offload_bench.py - KV offload of one long context in vLLM 0.33's
exact KV cache layout: kvtier.gpu's fused store (paged cache -> compressed
payloads in pinned host memory) and load (payloads -> other, shuffled blocks),
per codec, against the copies vLLM's own CPU offload makes of the same blocks
in the same run.

Default shape: a 32K-token Llama-3.1-8B context (32 layers, 8 KV heads, head
dim 128, bf16, block size 16: 4 GiB of K/V in 2048 blocks), vLLM's default
layout LBNHC ("NHD"), payloads of 256 tokens (16 blocks) each, block ids
shuffled over a cache of twice the context. Rates are GB/s of bf16 K/V
(restored on loads, read on stores): for kvtier, the bytes of the 16-bit
K/V the payloads stand for, not the payload bytes.

Baselines, same blocks, same pinned-host direction:
  gather   torch index_select of the blocks of each layer into a contiguous
           device buffer, then a non_blocking copy to/from pinned host memory
           (loads: the copy, then index_copy_ into the blocks);
  batch    vLLM 0.33's swap_blocks_batch: one cudaMemcpyBatchAsync with one
           descriptor per (layer, block) page (bench/vllm_offload_pagecopy.cu,
           built with nvcc; skipped without it);
  contig   cudaMemcpyAsync (torch copy_) of the same bytes as one contiguous
           run per layer: the copy engine's ceiling, no gather at all.
kvtier store: PagedKV.store_many of every payload on one stream: the store
kernels back to back, each finished payload sealed (its XXH3 checksums, on
the host) on one of --threads threads ("store 1t": one thread, one store in
flight). kvtier load: every payload's load launched on one stream, then one
synchronize: "checked" is load_many, each payload's section checksums
verified on --threads host threads before its launch ("load 1t": one
thread, the check inside each load call), "trusted" skips the check
(trust=True: the tier verified the bytes). Wall-clock times, median of --iters after a
warm-up. Correctness is checked in the same run: raw restores every bit,
k16v8 every K bit, and each codec's restored blocks equal kvtier.decode()
of the payload (first payload).

    PYTHONPATH=python python3 bench/vllm_offload_bench.py --out bench/results/x.txt
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python" / "tests"))  # vllm_layout

import kvtier  # noqa: E402
import kvtier.gpu as kg  # noqa: E402
import vllm_layout  # noqa: E402


def timed(fn: Callable[[], None], iters: int, warm: Optional[Callable[[], None]] = None) -> float:
    """Median wall seconds of fn() (synchronized), after one warm-up run."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        if warm is not None:
            warm()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def pagecopy_lib(path: Optional[str]) -> Optional[ctypes.CDLL]:
    if path is None:
        nvcc = "nvcc"
        out = Path(tempfile.mkdtemp()) / "libkvtb_pagecopy.so"
        try:
            subprocess.run([nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
                            "-o", str(out), str(HERE / "vllm_offload_pagecopy.cu")],
                           check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"# batch baseline skipped: nvcc failed: {e}", file=sys.stderr)
            return None
        path = str(out)
    lib = ctypes.CDLL(path)
    lib.kvtb_copy_batch.restype = ctypes.c_int
    lib.kvtb_copy_batch.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_int,
                                                            ctypes.c_void_p]
    return lib


def add_shape_args(ap: argparse.ArgumentParser) -> None:
    """The context, cache layout, codecs and repetitions of the vLLM offload
    benchmarks (this one and vllm_worker_bench.py)."""
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--layout", default="LBNHC", choices=vllm_layout.ORDERS)
    ap.add_argument("--codecs", default="raw,k16v8,fp8,int4")
    ap.add_argument("--iters", type=int, default=5)


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(ap)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--pagecopy-lib", help="a built bench/vllm_offload_pagecopy.cu "
                    "(default: build it with nvcc)")
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args(argv)

    dev = torch.device("cuda")
    L, H, D, N = a.layers, a.heads, a.head_dim, a.block_size
    nctx = a.tokens // N
    per_chunk = a.chunk_tokens // N
    nchunks = nctx // per_chunk
    B = 2 * nctx + 64
    page = H * N * 2 * D * 2  # bytes of one layer's page of a block
    kv_bytes = L * nctx * page
    lines: List[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    props = torch.cuda.get_device_properties(dev)
    say(f"# bench/vllm_offload_bench.py on {props.name} ({props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, libkvtier {kvtier.library_version}")
    say(f"# command: {' '.join([os.path.basename(sys.argv[0])] + list(argv))}")
    say(f"# context {a.tokens} tokens = {nctx} blocks of {N}, {L} layers x {H} KV heads x "
        f"head dim {D}, bf16, vLLM layout {a.layout}: {kv_bytes / 2**30:.2f} GiB of K/V; "
        f"cache of {B} blocks; payloads of {a.chunk_tokens} tokens ({nchunks}); "
        f"median of {a.iters}")

    raw, views = vllm_layout.torch_layer_views(torch, a.layout, L, B, H, N, D, torch.bfloat16,
                                               dev)
    g = torch.Generator(device=dev).manual_seed(1)
    for v in views:
        v.copy_(torch.randn(v.shape, device=dev, generator=g).to(torch.bfloat16))
    perm = np.random.default_rng(2).permutation(B)
    src, dst = perm[:nctx], perm[nctx:2 * nctx]
    src_t, dst_t = torch.as_tensor(src, device=dev), torch.as_tensor(dst, device=dev)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()

    # ---- baselines --------------------------------------------------------------
    host = torch.empty(L, nctx * page, dtype=torch.uint8, pin_memory=True)
    stage = torch.empty((nctx,) + tuple(views[0].shape[1:]), dtype=torch.bfloat16, device=dev)
    stage_b = stage.view(torch.uint8).reshape(-1)
    warm_src = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    warm_dst = torch.empty(1 << 20, dtype=torch.uint8, device=dev)

    def warm() -> None:  # the first transfer after host-only work runs slow
        warm_dst.copy_(warm_src, non_blocking=True)

    def gather_store() -> None:
        with torch.cuda.stream(stream):
            for l, v in enumerate(views):
                torch.index_select(v, 0, src_t, out=stage)
                host[l].copy_(stage_b, non_blocking=True)
        stream.synchronize()

    def gather_load() -> None:
        with torch.cuda.stream(stream):
            for l, v in enumerate(views):
                stage_b.copy_(host[l], non_blocking=True)
                v.index_copy_(0, dst_t, stage)
        stream.synchronize()

    res: Dict[str, float] = {}
    res["gather D2H"] = kv_bytes / timed(gather_store, a.iters, warm) / 1e9
    res["gather H2D"] = kv_bytes / timed(gather_load, a.iters, warm) / 1e9
    ok = all(torch.equal(v.index_select(0, dst_t), v.index_select(0, src_t)) for v in views)
    say(f"# gather baseline restores the blocks exactly: {ok}")

    # One copy per page needs pages that are one run (not LHBNC, BHLNC).
    lib = pagecopy_lib(a.pagecopy_lib) if a.layout.endswith(("NHC", "HNC")) and \
        a.layout not in ("LHBNC", "BHLNC") else None
    if lib is not None:
        sb = views[0].stride(0) * 2
        hbase = host.data_ptr()
        vb = np.array([v.data_ptr() for v in views], np.int64)[:, None]
        gpu_src = (vb + src.astype(np.int64)[None, :] * sb).reshape(-1)
        gpu_dst = (vb + dst.astype(np.int64)[None, :] * sb).reshape(-1)
        hp = (hbase + np.arange(L * nctx, dtype=np.int64) * page)
        sizes = np.full(L * nctx, page, np.uint64)

        per_call = [len(sizes)]  # one call for the whole context, as one vLLM job

        def batch(d: np.ndarray, s: np.ndarray, any_order: int) -> Callable[[], None]:
            def run() -> None:
                step = per_call[0]
                for i in range(0, len(sizes), step):
                    rc = lib.kvtb_copy_batch(d[i:].ctypes.data, s[i:].ctypes.data,
                                             sizes[i:].ctypes.data, min(step, len(sizes) - i),
                                             any_order, stream.cuda_stream)
                    if rc and step > 512:  # a driver limit on one batch: 512 per call
                        say(f"# one cudaMemcpyBatchAsync of {step} copies failed (CUDA error "
                            f"{rc}): batches of 512 (one payload's pages) instead")
                        per_call[0] = 512
                        return run()
                    if rc:
                        raise RuntimeError(f"cudaMemcpyBatchAsync: CUDA error {rc}")
                stream.synchronize()
            return run

        res["batch D2H"] = kv_bytes / timed(batch(hp, gpu_src, 0), a.iters, warm) / 1e9
        res["batch H2D"] = kv_bytes / timed(batch(gpu_dst, hp, 1), a.iters, warm) / 1e9
        say(f"# batch baseline: {per_call[0]} page copies per cudaMemcpyBatchAsync; restores "
            "exactly: " + str(all(torch.equal(v.index_select(0, dst_t), v.index_select(0, src_t))
                                  for v in views)))

    rawu = raw.view(torch.uint8)  # host is uint8: same-dtype copies are plain DMA
    contig = [rawu[l * B * page:(l * B + nctx) * page] if a.layout.startswith("LB") else None
              for l in range(L)]
    if all(c is not None for c in contig):
        def contig_d2h() -> None:
            with torch.cuda.stream(stream):
                for l in range(L):
                    host[l].copy_(contig[l], non_blocking=True)
            stream.synchronize()

        def contig_h2d() -> None:
            with torch.cuda.stream(stream):
                for l in range(L):
                    contig[l].copy_(host[l], non_blocking=True)
            stream.synchronize()

        saved = torch.stack([c.clone() for c in contig])  # contig_h2d overwrites blocks 0..
        res["contig D2H"] = kv_bytes / timed(contig_d2h, a.iters, warm) / 1e9
        res["contig H2D"] = kv_bytes / timed(contig_h2d, a.iters, warm) / 1e9
        for l in range(L):
            contig[l].copy_(saved[l])
        del saved
    del host, stage
    torch.cuda.synchronize()
    say("")
    say("# baselines (GB/s of bf16 K/V between the cache's blocks and pinned host memory)")
    for k, v in res.items():
        say(f"{k:<12} {v:7.2f}")

    # ---- kvtier -------------------------------------------------------------------
    codecs = a.codecs.split(",")
    kv = kg.PagedKV(views, store_handles=a.threads)
    kv1 = kg.PagedKV(views, store_handles=2)  # one sealing while the next one stores
    caps = {c: (kv.store_bound(a.chunk_tokens, c) + 4095) // 4096 * 4096 for c in codecs}
    arena = kg.PinnedBuffer(max(caps.values()) * nchunks)
    chunks_src = [src[i * per_chunk:(i + 1) * per_chunk] for i in range(nchunks)]
    chunks_dst = [dst[i * per_chunk:(i + 1) * per_chunk] for i in range(nchunks)]
    keys = [kvtier.Key(i.to_bytes(16, "little")) for i in range(nchunks)]
    say("")
    say("# kvtier.gpu (GB/s of bf16 K/V; x = ratio to the baseline of the same direction)")
    hdr = (f"{'codec':<7} {'ratio':>5} {'store1t':>7} {'store':>7} {'xgath':>6} {'xbatch':>6} "
           f"{'xcont':>6} {'load1t':>7} {'load':>7} {'xgath':>6} {'xbatch':>6} {'xcont':>6} "
           f"{'trusted':>7} {'xbatch':>6} {'xcont':>6}  exact")
    say(hdr)
    for codec in codecs:
        cap = caps[codec]
        lens = [0] * nchunks

        def slot(i: int) -> Any:
            return arena.array[i * cap:(i + 1) * cap]

        outs = [slot(i) for i in range(nchunks)]

        def store1() -> None:
            prev = None
            for i in range(nchunks):
                job = kv1.store_async(chunks_src[i], outs[i], codec=codec, key=keys[i],
                                      stream=stream)
                if prev is not None:
                    lens[i - 1] = prev.finish()
                prev = job
            assert prev is not None
            lens[nchunks - 1] = prev.finish()

        def store() -> None:
            lens[:] = kv.store_many(chunks_src, outs, keys=keys, codec=codec, stream=stream)

        def load1() -> None:
            for i in range(nchunks):
                kv.load(outs[i][:lens[i]], chunks_dst[i], expect_key=keys[i], stream=stream)
            stream.synchronize()

        def load_many() -> None:
            kv.load_many(outs, chunks_dst, lengths=lens, keys=keys, threads=a.threads,
                         stream=stream)
            stream.synchronize()

        def trusted() -> None:
            for i in range(nchunks):
                kv.load(outs[i][:lens[i]], chunks_dst[i], expect_key=keys[i], trust=True,
                        stream=stream)
            stream.synchronize()

        t_store1 = timed(store1, a.iters, warm)
        t_store = timed(store, a.iters, warm)
        t_load1 = timed(load1, a.iters, warm)
        t_load = timed(load_many, a.iters, warm)
        t_trust = timed(trusted, a.iters, warm)
        # Correctness of what the last load left.
        exact = "ok"
        for v in views:
            got_l, want_l = v.index_select(0, dst_t), v.index_select(0, src_t)
            if codec in ("raw", "k16v8") and not torch.equal(got_l[..., :D], want_l[..., :D]):
                exact = "K DIFFERS"
            if codec == "raw" and not torch.equal(got_l, want_l):
                exact = "DIFFERS"
            del got_l, want_l
        k_dec, v_dec = kvtier.decode(bytes(slot(0)[:lens[0]]))
        ids0 = torch.as_tensor(chunks_dst[0], device=dev)
        got = torch.stack([v.index_select(0, ids0).transpose(1, 2).reshape(-1, H, 2 * D)
                           for v in views]).view(torch.int16).cpu().numpy().view(np.uint16)
        if not (np.array_equal(got[..., :D], k_dec) and np.array_equal(got[..., D:], v_dec)):
            exact = "NOT decode()"
        ratio = per_chunk * N * L * H * D * 4 / lens[0]
        st1, st, ld1, ld, tr = (kv_bytes / t / 1e9
                                for t in (t_store1, t_store, t_load1, t_load, t_trust))

        def x(val: float, key: str) -> str:
            return f"{val / res[key]:6.2f}" if key in res else f"{'-':>6}"

        say(f"{codec:<7} {ratio:5.2f} {st1:7.2f} {st:7.2f} {x(st, 'gather D2H')} "
            f"{x(st, 'batch D2H')} {x(st, 'contig D2H')} {ld1:7.2f} {ld:7.2f} "
            f"{x(ld, 'gather H2D')} {x(ld, 'batch H2D')} "
            f"{x(ld, 'contig H2D')} {tr:7.2f} {x(tr, 'batch H2D')} {x(tr, 'contig H2D')}  "
            f"{exact}")
    say("")
    say(f"# ratio: bf16 K/V bytes / payload bytes; store1t / store: every payload stored and "
        f"sealed on the host, 1 / {a.threads} threads; load1t / load: checked on the host, "
        f"1 / {a.threads} threads; trusted: trust=True; exact: restored bits checked")
    kv.close()
    kv1.close()
    arena.close()
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
