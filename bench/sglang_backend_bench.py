#!/usr/bin/env python3
"""bench/sglang_backend_bench.py: SGLang HiCache L3 storage, kvtier.sglang
against SGLang's own file backend (HiCacheFile), same host pool, same
directory, same run.

A Llama-3.1-8B-shaped host pool (32 layers, 8 KV heads, head_dim 128, bf16;
SGLang's MHATokenToKVPoolHost in CPU memory) of --pages pages is written to
storage and read back, in batches of 128 pages (SGLang's STORAGE_BATCH_SIZE),
the way SGLang's cache controller drives each backend:
  - HiCacheFile: _generic_page_set / _generic_page_get (a host page copied
    out with get_data_page, batch_set; batch_get into dummy pages, copied
    in with set_from_flat_data_page);
  - kvtier: batch_set_v1 / batch_get_v1 (interface_v1), encode/decode in place.
Every read is checked: the pool's bytes after a get must equal what was
written (raw), or kvtier's own decode of each page (lossy codecs), else the
run fails. Each backend gets a fresh subdirectory of --dir.

With --drop-caches (root), the page cache is synced and dropped before each
write and each read pass, so reads come from the disk. HiCacheFile writes
through the page cache without fsync; kvtier's nvme tier writes with O_DIRECT
and fdatasync per payload (a stored page is durable when batch_set returns):
"durable" adds the os.sync() after HiCacheFile's writes, its time to the same
guarantee. --kvtier-dram SIZE puts a kvtier DRAM tier above the nvme one
(write-through), kvtier's counterpart of the page cache HiCacheFile reads from
when caches are not dropped.

Run in the venv of `./bootstrap.sh sglang`, e.g.
  KVTIER_LIBRARY=build/libkvtier.so.0.3 PYTHONPATH=python \\
    ~/.cache/kvtier/venv-sglang/bin/python bench/sglang_backend_bench.py \\
    --dir /mnt/nvme/bench --pages 1000 --page-size 16 --codecs raw,k16v8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import kvtier

LAYERS, HEADS, DIM = 32, 8, 128  # Llama-3.1-8B, one rank
BATCH = 128  # sglang/srt/mem_cache/hicache_storage.py STORAGE_BATCH_SIZE


def make_host(pages: int, page: int, layout: str) -> Any:
    dev = MHATokenToKVPool(4 * page, page, torch.bfloat16, HEADS, DIM, LAYERS, "cpu", False,
                           start_layer=0, end_layer=LAYERS)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 1.0, 0, page, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=LAYERS,
                                host_token_capacity=(pages + 1) * page)
    g = torch.Generator().manual_seed(7)
    flat = host.kv_buffer.view(-1)
    step = 1 << 26
    for s in range(0, flat.numel(), step):  # finite values, KV-like scale
        n = min(step, flat.numel() - s)
        flat[s:s + n] = torch.randn(n, generator=g).to(torch.bfloat16)
    return host


def storage_config(extra: Dict[str, Any]) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name="meta-llama/Llama-3.1-8B",
                                extra_config=extra)


def digest(host: Any, idx: torch.Tensor, page: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    for i in range(0, idx.numel(), page):
        h.update(host.get_data_page(int(idx[i]), flat=True).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def drop_caches(enabled: bool) -> bool:
    if not enabled:
        return False
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError as e:
        raise SystemExit(f"--drop-caches: cannot write /proc/sys/vm/drop_caches: {e}")


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def file_pass(host: Any, idx: torch.Tensor, keys: List[str], page: int, where: Path,
              drop: bool) -> Dict[str, Any]:
    be = HiCacheFile(storage_config({"file_storage_path": str(where)}), file_path=str(where))
    be.register_mem_pool_host(host)

    def put() -> None:
        for b in range(0, len(keys), BATCH):
            ks = keys[b:b + BATCH]
            data = [host.get_data_page(idx[(b + i) * page]) for i in range(len(ks))]
            assert be.batch_set(ks, data)

    def get() -> None:
        for b in range(0, len(keys), BATCH):
            ks = keys[b:b + BATCH]
            dummy = [host.get_dummy_flat_data_page() for _ in ks]
            got = be.batch_get(ks, dummy)
            for i, d in enumerate(got):
                assert d is not None, f"HiCacheFile lost page {b + i}"
                host.set_from_flat_data_page(idx[(b + i) * page], d)

    want = digest(host, idx, page)
    drop_caches(drop)
    set_s = timed(put)
    durable_s = set_s + timed(os.sync)
    dropped = drop_caches(drop)
    host.kv_buffer.zero_()
    get_s = timed(get)
    if digest(host, idx, page) != want:
        raise SystemExit("HiCacheFile: pages read back differ from those written")
    size = sum(p.stat().st_size for p in where.iterdir() if p.suffix == ".bin")
    return {"set_s": set_s, "durable_s": durable_s, "get_s": get_s, "stored_bytes": size,
            "cold_read": dropped}


def kvtier_pass(host: Any, idx: torch.Tensor, keys: List[str], page: int, where: Path,
                codec: str, threads: int, drop: bool, capacity: str,
                dram: str) -> Dict[str, Any]:
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang",
             "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
             "tiers": (f"dram:{dram};" if dram else "") + f"nvme:{where}:{capacity}", "codec": codec, "threads": threads}
    be = StorageBackendFactory.create_backend("dynamic", storage_config(extra), host)
    be.register_mem_pool_host(host)
    orig = host.kv_buffer.clone()

    def put() -> None:
        for b in range(0, len(keys), BATCH):
            ks = keys[b:b + BATCH]
            assert all(be.batch_set_v1(ks, idx[b * page:(b + len(ks)) * page]))

    def get() -> None:
        for b in range(0, len(keys), BATCH):
            ks = keys[b:b + BATCH]
            assert all(be.batch_get_v1(ks, idx[b * page:(b + len(ks)) * page]))

    drop_caches(drop)
    set_s = timed(put)
    dropped = drop_caches(drop)
    host.kv_buffer.zero_()
    get_s = timed(get)
    got = digest(host, idx, page)
    if codec == "raw":
        host.kv_buffer.copy_(orig)
        want = digest(host, idx, page)
    else:  # each page as kvtier decodes it, computed apart from the backend
        restored = host.kv_buffer.clone()
        host.kv_buffer.copy_(orig)
        for i in range(0, idx.numel(), page):
            (k, v), = be._views([keys[0]], idx[i:i + page])
            kvtier.decode(kvtier.encode(k, v, codec), k, v)
        want = digest(host, idx, page)
        host.kv_buffer.copy_(restored)
    if got != want:
        raise SystemExit(f"kvtier {codec}: pages read back differ from the codec's decode")
    hits = [be.cache.stats(t).hits for t in range(be.cache.tier_count)]
    be.close()
    host.kv_buffer.copy_(orig)
    size = sum(p.stat().st_size for p in where.rglob("*") if p.is_file() and
               not p.name.startswith("."))
    return {"set_s": set_s, "durable_s": set_s, "get_s": get_s, "stored_bytes": size,
            "cold_read": dropped, "hits_by_tier": hits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="a directory on the disk under test")
    ap.add_argument("--pages", type=int, default=1000)
    ap.add_argument("--page-size", type=int, default=16, help="tokens per page")
    ap.add_argument("--layout", default="page_first")
    ap.add_argument("--codecs", default="raw,k16v8")
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--kvtier-dram", default="", help="a DRAM tier above nvme, e.g. 4GiB")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    root = Path(a.dir)
    page_bytes = 2 * LAYERS * a.page_size * HEADS * DIM * 2
    host = make_host(a.pages, a.page_size, a.layout)
    idx = host.alloc(a.pages * a.page_size)
    keys = [hashlib.sha256(f"page{i}".encode()).hexdigest() for i in range(a.pages)]
    capacity = f"{max(1, 2 * a.pages * page_bytes >> 20)}MiB"
    rows: Dict[str, Dict[str, Any]] = {}
    for name in ["hicache_file"] + [f"kvtier:{c}" for c in a.codecs.split(",")]:
        where = root / name.replace(":", "-")
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        if name == "hicache_file":
            rows[name] = file_pass(host, idx, keys, a.page_size, where, a.drop_caches)
        else:
            rows[name] = kvtier_pass(host, idx, keys, a.page_size, where, name.split(":")[1],
                                     a.threads, a.drop_caches, capacity, a.kvtier_dram)
        shutil.rmtree(where, ignore_errors=True)
    kv_gb = a.pages * page_bytes / 1e9
    print(f"# {a.pages} pages x {a.page_size} tokens, Llama-3.1-8B shape ({page_bytes >> 10} KiB "
          f"of KV a page, {kv_gb:.2f} GB), layout {a.layout}, {a.threads} kvtier threads, "
          f"{'cold' if a.drop_caches else 'warm (page cache)'} reads, kvtier tiers "
          f"{(a.kvtier_dram and 'dram:' + a.kvtier_dram + ';') or ''}nvme; "
          f"{platform.node()}, {os.cpu_count()} cpus")
    print(f"{'backend':16} {'set pages/s':>12} {'durable p/s':>12} {'get pages/s':>12} "
          f"{'get KV GB/s':>12} {'stored GB':>10} {'get vs file':>12}")
    base = rows["hicache_file"]["get_s"]
    for name, r in rows.items():
        print(f"{name:16} {a.pages / r['set_s']:12.0f} {a.pages / r['durable_s']:12.0f} "
              f"{a.pages / r['get_s']:12.0f} {kv_gb / r['get_s']:12.2f} "
              f"{r['stored_bytes'] / 1e9:10.3f} {base / r['get_s']:11.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "page_bytes": page_bytes,
                                            "host": platform.node(), "cpus": os.cpu_count(),
                                            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
