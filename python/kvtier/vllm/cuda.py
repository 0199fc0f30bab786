"""CudaDevice: the plug-in worker's KVDevice (kvtier.vllm.worker) over
kvtier.gpu.PagedKV, the fused GPU store and load on vLLM's per-layer CUDA
tensors. Imports neither vLLM nor, until a device is made, torch.

Each transfer thread of the worker gets its own CUDA stream and page-locked
host buffer. A store's stream first waits for the event taken on the
engine's stream when the store was submitted, so it reads the blocks after
the forward pass that wrote them; store() and load() return once the
payload is sealed or the KV written (the worker reports a job only then).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .. import gpu
from ..errors import Error, ErrorCode
from ..keys import Key
from .config import CacheShape


LOAD_STAGING = 32 << 20  # device memory per load handle
# Chunks whose payloads average this or more are loaded one by one, not
# batched: on an H200 (bench/results/vllm_worker_batched_h200.txt, run 1, 4
# threads, 256-token chunks) raw's 32 MiB payloads loaded at 38.2 GB/s batched
# and 47.6 one by one, while k16v8's 24 MiB ones gained (43.7 -> 50.9; run 2:
# 47.7 -> 49.3), fp8 (46.3 -> 67.4) and int4 (44.0 -> 91.0): one payload fills
# the staging pieces by itself.
BATCH_BELOW = 32 << 20


class CudaDevice:
    """KVDevice over vLLM's per-layer caches [num_blocks, heads, block_size,
    2*head_dim] (layout "vllm": any of vLLM 0.33's KVCacheLayouts), with
    `codec` and `fingerprint` fixed. Raises kvtier.Error (KVT_ENOTSUP: fp8,
    MLA, no CUDA; KVT_ESHAPE: another shape) when the tensors do not fit."""

    def __init__(self, layers: Sequence[Any], shape: CacheShape, codec: str, fingerprint: Key,
                 threads: int = 2) -> None:
        t0 = layers[0]
        if t0.dim() == 4 and t0.shape[0] != shape.num_blocks:
            raise Error(ErrorCode.ENOTSUP, detail=f"{t0.shape[0]} kernel blocks for "
                        f"{shape.num_blocks} vLLM blocks: kernel block sizes smaller than the "
                        "block size are not supported")
        # Loads of several threads launch at once on up to 4 handles, each
        # with 32 MiB of staging memory (128 MiB of device memory in all).
        self.kv = gpu.PagedKV(list(layers), layout="vllm", head_dim=shape.head_dim,
                              model_layers=shape.layers, store_handles=max(4, threads),
                              load_handles=min(4, threads), staging_bytes=LOAD_STAGING)
        if self.kv.block_size != shape.block_size or self.kv.heads != shape.kv_heads:
            raise Error(ErrorCode.ESHAPE, detail=f"tensors of {self.kv.heads} heads x "
                        f"{self.kv.block_size} tokens per block; vLLM's spec says "
                        f"{shape.kv_heads} x {shape.block_size}")
        self.codec = codec
        self.fingerprint = fingerprint
        self.batch_below = BATCH_BELOW  # the worker loads larger chunks one by one
        self._local = threading.local()
        self._bounds: Dict[int, int] = {}
        self._torch = gpu._torch()

    def _stream(self) -> Any:
        s = getattr(self._local, "stream", None)
        if s is None:
            s = self._local.stream = self._torch.cuda.Stream(self.kv.device)
        return s

    def host_buffer(self, nbytes: int) -> np.ndarray:
        # One buffer per transfer thread: the worker replaces a thread's buffer
        # only between its transfers, so the one replaced is no longer in use.
        old: Optional[gpu.PinnedBuffer] = getattr(self._local, "buf", None)
        buf = self._local.buf = gpu.PinnedBuffer(nbytes)
        if old is not None:
            old.close()
        return buf.array

    def mark(self) -> Any:
        torch = self._torch
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.kv.device))
        return ev

    def payload_bytes(self, num_blocks: int) -> int:
        n = self._bounds.get(num_blocks)
        if n is None:
            n = self._bounds[num_blocks] = self.kv.store_bound(num_blocks * self.kv.block_size,
                                                               self.codec)
        return n

    def store(self, block_ids: Sequence[int], out: np.ndarray, *, key: Key, after: Any) -> int:
        s = self._stream()
        if after is not None:
            s.wait_event(after)
        need = self.payload_bytes(len(block_ids))
        if need > out.size:
            raise Error(ErrorCode.ENOBUFS, detail=f"a payload of {need} bytes, buffer {out.size}")
        return self.kv.store(list(block_ids), out[:need], codec=self.codec, key=key,
                             fingerprint=self.fingerprint, stream=s)

    def load(self, payload: np.ndarray, block_ids: Sequence[int], *, key: Key) -> None:
        torch = self._torch
        s = self._stream()
        if gpu.mem_kind(payload.ctypes.data) == gpu.MEM_PAGEABLE:
            # Lent by a dram tier that does not pin its slabs: the kernel and
            # the copy engine need page-locked memory.
            buf = self._pinned(payload.size)
            buf[:payload.size] = payload
            payload = buf[:payload.size]
        # kvt_gpu_load checks the header, key, fingerprint and shape before the
        # launch; every section's checksum is computed by the GPU as the
        # payload is staged, and wait() raises KVT_ECHECKSUM if one did not
        # match (the failed piece is not written; the chunk is a miss).
        with torch.cuda.stream(s):
            # A CUDA tensor of ids is taken as it is: the slots of a -1 block are
            # negative, and the load kernel skips slots outside the cache.
            ids = torch.tensor(list(block_ids), dtype=torch.int64, device=self.kv.device)
        self.kv.load(payload, ids, expect_key=key, expect_fingerprint=self.fingerprint,
                     verify_on_gpu=True, stream=s).wait()

    def load_many(self, payloads: Sequence[np.ndarray], block_ids: Sequence[Sequence[int]], *,
                  keys: Sequence[Key]) -> Optional[List[Optional[Error]]]:
        """Loads several chunks of one geometry with batched launches
        (PagedKV.load_batch: each verified on the GPU, with its own verdict);
        returns each chunk's outcome (None, or the Error that makes it a
        miss) once written. None, having written nothing, where the batch
        should not or cannot be made - payloads of BATCH_BELOW or more on
        average, a payload in pageable memory, chunks of another
        geometry, a payload refused before the launch (its header, key or
        shape): the worker then loads them one by one, which names the bad
        one."""
        torch = self._torch
        if sum(p.size for p in payloads) >= BATCH_BELOW * len(payloads):
            return None  # large payloads: one by one is faster (BATCH_BELOW)
        if any(gpu.mem_kind(p.ctypes.data) == gpu.MEM_PAGEABLE for p in payloads):
            return None
        s = self._stream()
        with torch.cuda.stream(s):  # one copy of every chunk's ids, a view each
            flat = torch.tensor([b for chunk in block_ids for b in chunk], dtype=torch.int64,
                                device=self.kv.device)
            ids = list(flat.split([len(b) for b in block_ids]))
        try:
            t = self.kv.load_batch(list(payloads), ids, keys=list(keys),
                                   expect_fingerprint=self.fingerprint, stream=s)
        except Error as e:
            if e.code == ErrorCode.ECUDA:
                raise
            return None
        return t.verdicts()

    def _pinned(self, nbytes: int) -> np.ndarray:
        buf: Optional[gpu.PinnedBuffer] = getattr(self._local, "staging", None)
        if buf is None or len(buf) < nbytes:
            if buf is not None:
                buf.close()
            buf = self._local.staging = gpu.PinnedBuffer(max(nbytes, 2 * len(buf) if buf else 0))
        return buf.array
