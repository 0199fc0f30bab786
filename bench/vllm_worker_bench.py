#!/usr/bin/env python3
"""bench/vllm_worker_bench.py - the kvtier vLLM plug-in WORKER's own store and
load path on one long context in vLLM 0.33's exact KV cache layout: what a
vLLM user gets, i.e. kvtier.vllm.worker.KvtierWorker over
kvtier.vllm.cuda.CudaDevice and a kvtier Cache over dram, jobs submitted as
vLLM's OffloadingConnector submits them (submit_store / submit_load with
GPULoadStoreSpec block ids and the plug-in's KvtierStoreSpec / KvtierLoadSpec
of offload keys), timed from the first submit until worker.wait() returns.

Per chunk the worker does (kvtier/vllm/worker.py): store = cache.query (held
already?), CudaDevice.store (the fused store kernel into the transfer
thread's page-locked buffer after an event on the engine's stream, then the
payload sealed - its XXH3 checksums - on the host), cache.put (a copy into
the dram tier); load = cache.borrow (the dram tier lends its own page-locked
bytes: no copy), CudaDevice.load (every section's XXH3 checked on the host
by this thread, then the fused load kernel, which checks header, key,
fingerprint and shape; waits for it). Every chunk of every job is one task
on the worker's transfer threads, so one request's chunks run in parallel.

Submitted as vLLM submits one request's work: the context stored as jobs of
--store-job-tokens (8192: vLLM 0.33's max_num_batched_tokens for `vllm
serve` on an H100/H200, so a chunked 32K prefill stores in 4 steps, one job
each) and loaded as ONE job (vLLM submits one load job per request), with
each of --worker-threads transfer threads (2,4,8; the plug-in's default is
marked).

Baselines and the handle-level figures come from bench/vllm_offload_bench.py,
run first IN THE SAME PROCESS (its main(), imported): torch index_select +
non_blocking copies to/from pinned host memory ("gather"), vLLM 0.33's
swap_blocks_batch (one cudaMemcpyBatchAsync of every page, "batch"), a
contiguous copy ("contig"), and kvtier.gpu.PagedKV store_many / load_many
on the same shape, seed and shuffled block ids. Rates are GB/s of bf16 K/V
restored (loads) or read (stores): the 16-bit K/V bytes the payloads stand
for, not payload bytes. Wall-clock, median of --iters after one warm-up;
before each timed store the cache's keys are deleted (untimed), since the
worker skips chunks the cache holds.

vLLM is not needed. kvtier.vllm.worker imports vllm.v1.kv_offload.base at
module import (its classes subclass vLLM's); where vLLM is not installed
(the GPU machine: its wheel is too large to carry) this script puts a
STAND-IN for that one module into sys.modules before importing the worker
(install_vllm_stand_in below): LoadStoreSpec, GPULoadStoreSpec, TransferResult,
OffloadingWorker and OffloadKey as vLLM 0.33.0 defines them (data holders and
an abstract base; no logic the worker's path runs), and inert placeholders
for the scheduler-side names kvtier.vllm.manager imports (never called
here). Everything timed is kvtier's code. Where vLLM is installed its real
module is used.

    PYTHONPATH=python python3 bench/vllm_worker_bench.py --pagecopy-lib X.so --out R.txt
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # vllm_offload_bench
sys.path.insert(0, str(HERE.parent / "python" / "tests"))  # vllm_layout

import kvtier  # noqa: E402
import vllm_layout  # noqa: E402
import vllm_offload_bench as handle_bench  # noqa: E402


from vllm_stand_in import install_vllm_stand_in  # noqa: E402

STAND_IN = install_vllm_stand_in()

from vllm.v1.kv_offload.base import GPULoadStoreSpec  # noqa: E402

from kvtier.vllm.config import CacheShape, model_fingerprint  # noqa: E402
from kvtier.vllm.cuda import CudaDevice  # noqa: E402
from kvtier.vllm.manager import KvtierLoadSpec, KvtierStoreSpec  # noqa: E402
from kvtier.vllm.worker import KvtierWorker  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RESERVATION_PUBLISH = kvtier.Reservation.publish


def offload_key(i: int) -> bytes:
    """A vLLM offload key: a 32-byte block hash (sha256 in vLLM) + group 0."""
    return hashlib.sha256(b"kvtier-bench-chunk-%d" % i).digest() + (0).to_bytes(4, "big")


class Breakdown:
    """Thread-seconds spent in each of the worker's calls into the cache and
    the device during one instrumented store and one load (wrappers on the
    instances; untimed pass)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.secs: Dict[str, float] = {}

    def wrap(self, obj: Any, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed_call(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                dt = time.perf_counter() - t0
                with self.lock:
                    self.secs[label] = self.secs.get(label, 0.0) + dt
        setattr(obj, name, timed_call)

    def take(self) -> Dict[str, float]:
        with self.lock:
            out, self.secs = self.secs, {}
        return out


def parse_handle(lines: Sequence[str]) -> Tuple[Dict[str, float], Dict[str, Dict[str, Any]]]:
    """The baselines and the kvtier.gpu rows of vllm_offload_bench's report."""
    base: Dict[str, float] = {}
    rows: Dict[str, Dict[str, Any]] = {}
    section = ""
    for ln in lines:
        if ln.startswith("# baselines"):
            section = "base"
        elif ln.startswith("# kvtier.gpu"):
            section = "kvtier"
        elif not ln or ln.startswith("#") or ln.startswith("codec "):
            continue
        elif section == "base":
            a, b, v = ln.split()
            base[f"{a} {b}"] = float(v)
        elif section == "kvtier":
            f = ln.split()
            rows[f[0]] = dict(ratio=float(f[1]), store1t=float(f[2]), store=float(f[3]),
                              load1t=float(f[7]), load=float(f[8]), trusted=float(f[12]),
                              exact=" ".join(f[15:]))
    return base, rows


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    handle_bench.add_shape_args(ap)
    ap.add_argument("--store-job-tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=8, help="threads of the handle bench's "
                    "store_many/load_many")
    ap.add_argument("--worker-threads", default="2,4,8,4c", help="the worker's transfer "
                    "threads, one timed run each; N'c': N threads loading chunk by chunk (the "
                    "device without load_many, as before 0.3.3)")
    ap.add_argument("--dram", default="12GiB", help="the cache's dram tier size")
    ap.add_argument("--pagecopy-lib", help="a built bench/vllm_offload_pagecopy.cu")
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args(argv)

    lines: List[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    L, H, D, N = a.layers, a.heads, a.head_dim, a.block_size
    nctx = a.tokens // N
    per_chunk = a.chunk_tokens // N
    nchunks = nctx // per_chunk
    B = 2 * nctx + 64  # as vllm_offload_bench: same cache, same shuffled ids
    kv_bytes = L * nctx * H * N * 2 * D * 2
    say(f"# bench/vllm_worker_bench.py on {props.name} ({props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, libkvtier {kvtier.library_version}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    say(f"# command: {' '.join([os.path.basename(sys.argv[0])] + list(argv))}")
    say(f"# vLLM: {'STAND-IN for vllm.v1.kv_offload.base (vLLM not installed)' if STAND_IN else 'installed'}")

    # ---- the handle level and the baselines, same process -------------------------
    hargs = ["--tokens", str(a.tokens), "--layers", str(L), "--heads", str(H),
             "--head-dim", str(D), "--block-size", str(N), "--chunk-tokens", str(a.chunk_tokens),
             "--layout", a.layout, "--codecs", a.codecs, "--iters", str(a.iters),
             "--threads", str(a.threads)]
    if a.pagecopy_lib:
        hargs += ["--pagecopy-lib", a.pagecopy_lib]
    with tempfile.TemporaryDirectory() as td:
        hout = Path(td) / "handle.txt"
        say(f"# first: vllm_offload_bench.main({' '.join(hargs)}) in this process")
        handle_bench.main(hargs + ["--out", str(hout)])
        hlines = hout.read_text().splitlines()
    base, hrows = parse_handle(hlines)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    # ---- the worker -----------------------------------------------------------------
    raw, views = vllm_layout.torch_layer_views(torch, a.layout, L, B, H, N, D, torch.bfloat16,
                                               dev)
    g = torch.Generator(device=dev).manual_seed(1)
    for v in views:
        v.copy_(torch.randn(v.shape, device=dev, generator=g).to(torch.bfloat16))
    perm = np.random.default_rng(2).permutation(B)
    src, dst = perm[:nctx], perm[nctx:2 * nctx]
    src_t, dst_t = torch.as_tensor(src, device=dev), torch.as_tensor(dst, device=dev)
    torch.cuda.synchronize()
    shape = CacheShape(layers=L, kv_heads=H, head_dim=D, dtype="bf16", block_size=N,
                       num_blocks=B, layer_names=tuple(f"model.layers.{i}.self_attn.attn"
                                                       for i in range(L)))
    okeys = [offload_key(i) for i in range(nchunks)]

    def jobs(ids: np.ndarray, job_tokens: int, load: bool) -> List[Tuple[Any, Any]]:
        """(GPULoadStoreSpec, kvtier spec) of each job, aligned to chunks."""
        per_job = max(1, job_tokens // a.chunk_tokens)
        out = []
        for c0 in range(0, nchunks, per_job):
            c1 = min(nchunks, c0 + per_job)
            blocks = [int(b) for b in ids[c0 * per_chunk:c1 * per_chunk]]
            gpu = GPULoadStoreSpec(blocks, group_sizes=[len(blocks)],
                                   block_indices=[c0 * per_chunk])
            keys = okeys[c0:c1]
            spec = KvtierLoadSpec(keys) if load else KvtierStoreSpec(
                keys, [okeys[c - 1] if c > 0 else None for c in range(c0, c1)])
            out.append((gpu, spec))
        return out

    from kvtier.vllm.config import PluginConfig
    default_threads = PluginConfig(tiers="dram:1GiB").transfer_threads
    modes = {f"w{t}": (int(t.rstrip("c")), a.store_job_tokens, a.tokens, t.endswith("c"))
             for t in a.worker_threads.split(",")}
    wthreads = [m[0] for m in modes.values() if not m[3]]
    main_mode = f"w{default_threads}" if default_threads in wthreads else list(modes)[-1]

    class PerChunk:
        """The device without load_many: the worker loads chunk by chunk."""

        def __init__(self, dev: Any) -> None:
            self._dev = dev

        def __getattr__(self, name: str) -> Any:
            if name == "load_many":
                raise AttributeError(name)
            return getattr(self._dev, name)

    res: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for codec in a.codecs.split(","):
        fp = model_fingerprint(MODEL, shape, codec, 0, 1)
        for mode, (threads, st_tokens, ld_tokens, per_chunk_loads) in modes.items():
            device = CudaDevice(views, shape, codec, fp, threads)
            if per_chunk_loads:
                device = PerChunk(device)
            cache = kvtier.Cache(f"dram:{a.dram}", fingerprint=fp, chunk_tokens=a.chunk_tokens,
                                 write_through=True)
            worker = KvtierWorker(device, cache, fp, a.chunk_tokens, per_chunk, threads=threads)
            st_jobs, ld_jobs = jobs(src, st_tokens, False), jobs(dst, ld_tokens, True)
            job_id = [0]
            failed: List[str] = []

            def run(js: List[Tuple[Any, Any]], load: bool) -> None:
                ids = set()
                for gpu, spec in js:
                    job_id[0] += 1
                    ids.add(job_id[0])
                    if load:
                        worker.submit_load(job_id[0], spec, gpu)
                    else:
                        worker.submit_store(job_id[0], gpu, spec)
                worker.wait(ids)
                for r in worker.get_finished():
                    if not r.success:
                        failed.append(f"job {r.job_id} {'load' if load else 'store'}")

            def clear() -> None:
                for k in okeys:
                    cache.delete(worker.key(k))

            def store() -> None:
                run(st_jobs, False)

            def load() -> None:
                run(ld_jobs, True)

            t_store = handle_bench.timed(store, a.iters, clear)
            held = cache.lookup_keys([worker.key(k) for k in okeys])
            payload_bytes = cache.stats().used
            t_load = handle_bench.timed(load, a.iters)
            brk: Dict[str, Any] = {}
            if mode == main_mode:  # where the worker's time goes: one instrumented pass each
                bd = Breakdown()
                for obj, name in ((cache, "query"), (cache, "put"), (cache, "get_into"),
                                  (cache, "borrow"), (cache, "reserve"),
                                  (kvtier.Reservation, "publish"),
                                  (device, "store"), (device, "load"),
                                  (device, "load_many")):
                    if hasattr(obj, name):
                        bd.wrap(obj, name, name)
                clear()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                store()
                brk["store"] = (time.perf_counter() - t0, bd.take())
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                load()
                brk["load"] = (time.perf_counter() - t0, bd.take())
                kvtier.Reservation.publish = RESERVATION_PUBLISH  # unwrapped
            exact = "ok"
            if failed or held != nchunks:
                exact = f"FAILED ({len(failed)} jobs, {held}/{nchunks} chunks held)"
            if not failed and held == nchunks:  # what the last load left, every mode
                for v in views:
                    got_l, want_l = v.index_select(0, dst_t), v.index_select(0, src_t)
                    if codec in ("raw", "k16v8") and not torch.equal(got_l[..., :D],
                                                                      want_l[..., :D]):
                        exact = "K DIFFERS"
                    if codec == "raw" and not torch.equal(got_l, want_l):
                        exact = "DIFFERS"
                    del got_l, want_l
                pay = cache.get(worker.key(okeys[0]))
                assert pay is not None
                k_dec, v_dec = kvtier.decode(pay)
                ids0 = torch.as_tensor(dst[:per_chunk], device=dev)
                got = torch.stack([v.index_select(0, ids0).transpose(1, 2).reshape(-1, H, 2 * D)
                                   for v in views]).view(torch.int16).cpu().numpy() \
                    .view(np.uint16)
                if not (np.array_equal(got[..., :D], k_dec) and
                        np.array_equal(got[..., D:], v_dec)):
                    exact = "NOT decode()"
            res[(codec, mode)] = dict(store=kv_bytes / t_store / 1e9,
                                      load=kv_bytes / t_load / 1e9, exact=exact,
                                      ratio=kv_bytes / max(1, payload_bytes),
                                      jobs=(len(st_jobs), len(ld_jobs), threads), brk=brk,
                                      stats=(worker.stats.failed_stores, worker.stats.failed_loads,
                                             dict(worker.stats.reasons)))
            worker.shutdown()  # closes the cache
            device.kv.close()
            del device, worker
            torch.cuda.synchronize()

    # ---- report ---------------------------------------------------------------------
    say(f"# context {a.tokens} tokens = {nctx} blocks of {N}, {L} layers x {H} KV heads x "
        f"head dim {D}, bf16, vLLM layout {a.layout}: {kv_bytes / 2**30:.2f} GiB of K/V; cache "
        f"of {B} blocks, shuffled ids (same as the handle bench); {nchunks} payloads of "
        f"{a.chunk_tokens} tokens; cache dram:{a.dram}; median of {a.iters}")
    for mode, (threads, st, ld, per_chunk_loads) in modes.items():
        r = next(v for (c, m), v in res.items() if m == mode)
        say(f"# worker '{mode}': {threads} transfer threads"
            f"{', chunk by chunk' if per_chunk_loads else ''}"
            f"{' (the plug-in default)' if mode == main_mode else ''}; store = "
            f"{r['jobs'][0]} jobs of {st} tokens, load = {r['jobs'][1]} jobs of {ld} tokens")
    say("")
    say("# baselines, same process (GB/s of bf16 K/V, blocks <-> pinned host memory)")
    say("  " + "  ".join(f"{k} {v:.2f}" for k, v in base.items()))
    say("")
    bst = "batch D2H" if "batch D2H" in base else "gather D2H"
    bld = "batch H2D" if "batch H2D" in base else "gather H2D"
    ht = f"h{a.threads}t"
    ms = list(modes)
    fst = max((k for k in base if k.endswith("D2H")), key=lambda k: base[k])
    fld = max((k for k in base if k.endswith("H2D")), key=lambda k: base[k])
    say(f"# GB/s of bf16 K/V. h1t / {ht}: the handle (kvtier.gpu.PagedKV: one thread; "
        f"store_many / load_many on {a.threads}); {' / '.join(ms)}: the worker (KvtierWorker + "
        f"CudaDevice + Cache over dram) on that many threads; xb: worker '{main_mode}' / the "
        f"{bst.split()[0]} baseline (vLLM's own offload copy); xf: worker '{main_mode}' / the "
        f"fastest copy of the run ({fst} / {fld})")
    width = 7 * (len(ms) + 4) + 1
    say(f"{'':<13}|{'store GPU->cache':^{width}}|{'load cache->GPU':^{width}}|")
    cols = f"{'h1t':>6} {ht:>6} " + " ".join(f"{m:>6}" for m in ms) + f" {'xb':>6} {'xf':>6}"
    say(f"{'codec':<7} {'ratio':>5}| {cols} | {cols} | exact (worker, handle)")
    for codec in a.codecs.split(","):
        h = hrows.get(codec, {})
        w = res[(codec, main_mode)]
        exs = sorted({res[(codec, m)]["exact"] for m in ms})
        ex = exs[0] if len(exs) == 1 else "/".join(exs)

        def col(x: Optional[float]) -> str:
            return f"{x:6.2f}" if x is not None else f"{'-':>6}"

        def side(op: str, hk: str, b: str, f: str) -> str:
            return (f"{col(h.get(hk + '1t'))} {col(h.get(hk))} "
                    + " ".join(f"{res[(codec, m)][op]:6.2f}" for m in ms)
                    + f" {w[op] / base[b]:6.2f} {w[op] / base[f]:6.2f}")

        say(f"{codec:<7} {w['ratio']:5.2f}| {side('store', 'store', bst, fst)} "
            f"| {side('load', 'load', bld, fld)} | {ex}, {h.get('exact', '?')}")
    say("")
    say("# ratio: bf16 K/V bytes / bytes the dram tier holds (payloads); exact: after the worker's "
        "loads, raw restores every bit, k16v8 every K bit, chunk 0 equals kvtier.decode() of the "
        "cached payload")
    say(f"# where the worker '{main_mode}' spends its time (one instrumented pass): wall ms, then "
        "thread-ms in each call, summed over the transfer threads (so calls sum past the "
        "wall); device.store = kernel + GPU seal (into a block reserved in the dram tier: "
        "reserve, then publish = header check + index), device.load = header check + "
        "staged H2D + GPU checksums + kernel, waited for with its verdict, device.load_many "
        "= the same for a group of up to 16 chunks (batched launches), put = a copy into "
        "the dram tier (when a store cannot reserve), borrow = the "
        "loan of a payload in place")
    def owner(call: str) -> str:
        if call in ("query", "put", "get_into", "borrow", "reserve"):
            return "cache."
        return "reservation." if call == "publish" else "device."

    for codec in a.codecs.split(","):
        for op in ("store", "load"):
            wall, parts = res[(codec, main_mode)]["brk"][op]
            say(f"  {codec:<6} {op:<5} wall {wall * 1e3:7.1f}  " + "  ".join(
                f"{owner(k) + k} "
                f"{v * 1e3:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
    bad = {k: v["stats"] for k, v in res.items() if v["stats"][0] or v["stats"][1]}
    say(f"# worker failures: {bad if bad else 'none'}")
    say("")
    say("# the handle bench's own report (same process, first):")
    lines.extend("#| " + ln for ln in hlines)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
