#!/usr/bin/env python3
"""bench/lmcache_plugin_bench.py: LMCache storage, kvtier.lmcache against
LMCache's own LocalDiskBackend, same chunks, same directory, same run.

Chunks of a Llama-3.1-8B-shaped model (32 layers, 8 KV heads, head_dim 128,
bf16; KV_2LTD MemoryObjs from LMCache's LocalCPUBackend allocator) are
written and read back through each backend's StorageBackendInterface, in
batches (--batch keys), the way LMCache's StorageManager drives a backend:
batched_submit_put_task, then waiting until the puts are done (LocalDiskBackend:
exists_in_put_tasks; kvtier: the returned futures), then batched_get_blocking.
--sources distinct chunks are filled once and stored under --chunks keys
(the allocator need not hold every chunk). Every read is checked against the
source: all bytes for raw, K's bytes and V within the codec's error for
k16v8, else the run fails. Each backend gets a fresh subdirectory of --dir.

With --drop-caches (root), the page cache is synced and dropped before each
write and read pass, so reads come from the disk. LocalDiskBackend writes
through the page cache without fsync; kvtier's nvme tier writes with O_DIRECT
and fdatasync per payload: "durable" adds an os.sync() after LocalDiskBackend's
writes, its time to the same guarantee. --kvtier-dram SIZE puts a kvtier DRAM
tier above the nvme one (write-through), kvtier's counterpart of the page
cache LocalDiskBackend reads from when caches are not dropped.

Run in the venv of `./bootstrap.sh lmcache`, e.g.
  KVTIER_LIBRARY=build/libkvtier.so.0.3 PYTHONPATH=python \\
    ~/.cache/kvtier/venv-lmcache/bin/python bench/lmcache_plugin_bench.py \\
    --dir /mnt/nvme/bench --chunks 1000 --chunk-tokens 16 --codecs raw,k16v8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

import kvtier
from kvtier.lmcache import KvtierStoragePlugin

LAYERS, HEADS, DIM = 32, 8, 128  # Llama-3.1-8B, one worker
MODEL = "bench/llama-3.1-8b"


def drop_caches(enabled: bool) -> bool:
    os.sync()
    if not enabled:
        return False
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError as e:
        raise SystemExit(f"--drop-caches needs root: {e}")


def run_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


def keys_of(n: int) -> List[CacheEngineKey]:
    return [CacheEngineKey(MODEL, 1, 0, 0x9E3779B97F4A7C15 * (i + 1) % 2**64, torch.bfloat16)
            for i in range(n)]


def check(src: torch.Tensor, got: torch.Tensor, codec: str) -> None:
    if codec == "raw":
        ok = torch.equal(src, got)
    else:
        ok = torch.equal(src[0], got[0]) and torch.allclose(
            src[1].float(), got[1].float(), atol=0.3 * src[1].abs().max().item())
    if not ok:
        raise SystemExit("a chunk read back differs from what was stored")


def one_pass(name: str, backend: Any, srcs: List[Any], keys: List[CacheEngineKey],
             batch: int, codec: str, drop: bool, where: Path) -> Dict[str, Any]:
    chunk_bytes = srcs[0].get_size()
    drop_caches(drop)
    t0 = time.perf_counter()
    for b in range(0, len(keys), batch):
        ks = keys[b:b + batch]
        objs = [srcs[(b + j) % len(srcs)] for j in range(len(ks))]
        futures = backend.batched_submit_put_task(ks, objs)
        for f in futures or []:
            f.result()
        while any(backend.exists_in_put_tasks(k) for k in ks):
            time.sleep(0.0005)
    t_set = time.perf_counter() - t0
    os.sync()
    t_durable = time.perf_counter() - t0
    drop_caches(drop)
    t_get = 0.0  # the reads alone; each batch is checked after its clock stops
    for b in range(0, len(keys), batch):
        ks = keys[b:b + batch]
        t0 = time.perf_counter()
        got = backend.batched_get_blocking(ks)
        t_get += time.perf_counter() - t0
        for j, o in enumerate(got):
            if o is None:
                raise SystemExit(f"{name}: chunk {b + j} missing")
            check(srcs[(b + j) % len(srcs)].tensor, o.tensor, codec)
            o.ref_count_down()
    stored = sum(p.stat().st_size for p in where.rglob("*") if p.is_file())
    n = len(keys)
    return {"backend": name, "codec": codec, "chunks": n, "set_chunks_s": n / t_set,
            "set_durable_chunks_s": n / t_durable, "get_chunks_s": n / t_get,
            "get_kv_gb_s": n * chunk_bytes / t_get / 1e9, "stored_gb": stored / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="a directory on the disk under test")
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--sources", type=int, default=16, help="distinct chunks in memory")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--codecs", default="raw,k16v8")
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--kvtier-dram", default="", help="a DRAM tier above nvme, e.g. 4GiB")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    base = Path(a.dir)
    chunk_gb = 2 * LAYERS * a.chunk_tokens * HEADS * DIM * 2 / 1e9
    cpu_gb = chunk_gb * (a.sources + 2 * a.batch) * 1.5 + 0.05
    md = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                         local_worker_id=0, kv_dtype=torch.bfloat16,
                         kv_shape=(LAYERS, 2, a.chunk_tokens, HEADS, DIM),
                         chunk_size=a.chunk_tokens)
    disk_gb = chunk_gb * a.chunks * 1.2 + 0.1
    results = []
    keys = keys_of(a.chunks)
    dram = f"dram:{a.kvtier_dram};" if a.kvtier_dram else ""
    for name in ["LocalDiskBackend"] + [f"kvtier {c}" for c in a.codecs.split(",")]:
        where = base / name.replace(" ", "-")
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        codec = name.split(" ", 1)[1] if name.startswith("kvtier") else "raw"
        cfg = LMCacheEngineConfig.from_dict({
            "chunk_size": a.chunk_tokens, "local_cpu": False, "max_local_cpu_size": cpu_gb,
            "local_disk": str(where) + "/", "max_local_disk_size": disk_gb,
            "extra_config": {"disk_io_threads": a.threads,
                             "storage_plugin.kvtier.module_path": "kvtier.lmcache",
                             "storage_plugin.kvtier.class_name": "KvtierStoragePlugin",
                             "storage_plugin.kvtier.tiers":
                                 dram + f"nvme:{where}/kv:{int(disk_gb * 1024)}MiB",
                             "storage_plugin.kvtier.codec": codec,
                             "storage_plugin.kvtier.threads": a.threads}})
        cpu = LocalCPUBackend(cfg, md, dst_device="cpu")
        loop = run_loop()
        if name == "LocalDiskBackend":
            backend: Any = LocalDiskBackend(cfg, loop, cpu, dst_device="cpu", metadata=md)
        else:
            backend = KvtierStoragePlugin(config=cfg, metadata=md, local_cpu_backend=cpu,
                                          loop=loop, dst_device="cpu")
        shape = torch.Size([2, LAYERS, a.chunk_tokens, HEADS * DIM])
        srcs = []
        for i in range(a.sources):
            o = cpu.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD)
            o.tensor.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(i))
                           .to(torch.bfloat16))
            srcs.append(o)
        r = one_pass(name, backend, srcs, keys, a.batch, codec, a.drop_caches, where)
        backend.close()
        loop.call_soon_threadsafe(loop.stop)
        results.append(r)
        print(json.dumps(r), flush=True)
    base_get = results[0]["get_chunks_s"]
    print(f"\n{a.chunks} chunks of {a.chunk_tokens} tokens ({chunk_gb * 1e3:.1f} MB of bf16 K/V "
          f"each), batches of {a.batch}, {a.threads} threads, drop caches: {a.drop_caches}; "
          f"{platform.node()}, {os.cpu_count()} cores, kvtier {kvtier.__version__}\n")
    print("| backend | set chunks/s | set, durable | get chunks/s | get KV GB/s | stored GB "
          "| get × LocalDisk |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['backend']} | {r['set_chunks_s']:.0f} | {r['set_durable_chunks_s']:.0f} | "
              f"{r['get_chunks_s']:.0f} | {r['get_kv_gb_s']:.2f} | {r['stored_gb']:.2f} | "
              f"{r['get_chunks_s'] / base_get:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=1))


if __name__ == "__main__":
    main()
