"""kvtier.gpu: the fused GPU store and load (kvtier/gpu.h) over an engine's
paged KV cache held in torch CUDA tensors.

    import torch, kvtier, kvtier.gpu as kg
    kv = kg.PagedKV(layer_tensors)           # vLLM's per-layer caches, layout from strides
    buf = kg.PinnedBuffer(kv.store_bound(len(block_ids) * kv.block_size, "k16v8"))
    n = kv.store(block_ids, buf, codec="k16v8", key=key, fingerprint=fp)
    t = kv.load(buf, other_block_ids, length=n, expect_key=key)   # on the current stream
    t.wait()

A store reads the blocks, quantizes in registers and writes the payload
(the bytes kvtier.encode() gives for the same K/V); a load checks the
payload, dequantizes in registers and writes the engine's slots (the values
kvtier.decode() gives). Both run on the caller's CUDA stream
(torch.cuda.current_stream() unless `stream=` names another, a
torch.cuda.Stream or a raw cudaStream_t as int). Payloads live in page-locked
host memory (PinnedBuffer, or a torch tensor made with pin_memory=True) or
in device memory (a CUDA uint8 tensor).

torch is imported only when a PagedKV is made: `import kvtier.gpu` works
without it (PinnedBuffer and layout_of need no torch). Failed calls raise
kvtier.Error (KVT_ECUDA with CUDA's message; KVT_ENOTSUP for a library
built without CUDA, a pageable payload buffer, an fp8 or MLA cache).
"""

from __future__ import annotations

import ctypes
import importlib
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
import weakref
from ctypes import POINTER, Structure, c_int, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

import numpy as np

from . import _structs as S
from ._buffers import read_buffer, write_buffer
from ._context import Context, ctx
from ._loader import lib
from .codec import Codec, _encode_params, codec_spec
from .errors import Error, ErrorCode
from .keys import Key, KeyLike

# --- the C API (kvtier/gpu.h) -------------------------------------------------

STAGING_DEFAULT = 64 << 20  # KVT_GPU_STAGING_DEFAULT

# enum kvt_gpu_load_flags
LOAD_TRUST_DEVICE, LOAD_TRUST_HOST, LOAD_ZERO_COPY, LOAD_STAGED = 1, 2, 4, 8
# enum kvt_gpu_mem
MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE = 0, 1, 2

# enum kvt_vllm_layout: vLLM 0.33's KVCacheLayout members, in its order.
VLLM_LAYOUTS: Tuple[str, ...] = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
_VLLM_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}


class kvt_gpu_layout_desc(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("dtype", c_int),
        ("layers", c_uint32),
        ("layer_begin", c_uint32),
        ("heads", c_uint32),
        ("head_dim", c_uint32),
        ("block_size", c_uint32),
        ("num_blocks", c_uint32),
        ("stride_block", c_int64),
        ("stride_token", c_int64),
        ("stride_head", c_int64),
        ("k_offset", c_int64),
        ("v_offset", c_int64),
        ("k_layers", POINTER(c_void_p)),
        ("v_layers", POINTER(c_void_p)),
        ("staging_bytes", c_uint64),
    ]


class kvt_gpu_store_params(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("encode", POINTER(S.kvt_encode_params)),
        ("layer_count", c_uint32),
        ("tokens", c_uint32),
        ("slots", c_void_p),
    ]


class kvt_gpu_load_params(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("expect_key", POINTER(S.kvt_key)),
        ("expect_fingerprint", POINTER(S.kvt_key)),
        ("layer_first", c_uint32),
        ("layer_count", c_uint32),
        ("tokens", c_uint32),
        ("slots", c_void_p),
        ("flags", c_uint32),
        ("layer_events", POINTER(c_void_p)),
        ("header", c_void_p),
        ("header_len", c_size_t),
        ("verdict", c_void_p),
    ]


class kvt_gpu_load_item(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("payload", c_void_p),
        ("len", c_size_t),
        ("slots", c_void_p),
        ("expect_key", POINTER(S.kvt_key)),
        ("verdict", c_void_p),
    ]


class kvt_gpu_verdict(Structure):
    _fields_ = [
        ("done", c_uint32),
        ("bad_section", c_uint32),
        ("layer_begin", c_uint32),
        ("sections", c_uint32),
        ("reserved", c_uint64 * 2),
    ]


_desc_p = POINTER(kvt_gpu_layout_desc)
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "kvt_gpu_layout_desc_vllm": (None, [_desc_p, c_int, c_uint32, POINTER(c_void_p), c_uint32,
                                        c_uint32, c_uint32, c_uint32]),
    "kvt_gpu_layout_desc_vllm_v1": (None, [_desc_p, c_int, c_uint32, POINTER(c_void_p),
                                           c_uint32, c_uint32, c_uint32, c_uint32, c_int]),
    "kvt_gpu_layout_create": (c_int, [c_void_p, _desc_p, POINTER(c_void_p)]),
    "kvt_gpu_layout_destroy": (None, [c_void_p]),
    "kvt_gpu_mem_kind": (c_int, [c_void_p, c_void_p, POINTER(c_int)]),
    "kvt_gpu_host_register": (c_int, [c_void_p, c_void_p, c_size_t]),
    "kvt_gpu_host_unregister": (c_int, [c_void_p, c_void_p]),
    "kvt_gpu_store_bound": (c_int, [c_void_p, POINTER(kvt_gpu_store_params),
                                    POINTER(c_uint64)]),
    "kvt_gpu_store_async": (c_int, [c_void_p, POINTER(kvt_gpu_store_params), c_void_p, c_size_t,
                                    POINTER(c_size_t), c_void_p]),
    "kvt_gpu_store_finish": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p]),
    "kvt_gpu_load": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(kvt_gpu_load_params),
                             c_void_p]),
    "kvt_gpu_verdict_check": (c_int, [c_void_p, c_void_p]),
    "kvt_gpu_load_batch": (c_int, [c_void_p, POINTER(kvt_gpu_load_item), c_uint32,
                                   POINTER(kvt_gpu_load_params), c_void_p]),
}


def _declare() -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise ImportError(f"kvtier.gpu: the loaded libkvtier lacks {name}: {e}") from e
        fn.restype = restype
        fn.argtypes = argtypes
    # The library writes struct_size: the mirror must be as large.
    buf = (ctypes.c_uint8 * 512)()
    lib.kvt_gpu_layout_desc_vllm(ctypes.cast(buf, _desc_p), 1, 1, None, 1, 1, 1, 1)
    size = ctypes.c_size_t.from_buffer(buf).value
    if size != ctypes.sizeof(kvt_gpu_layout_desc):
        raise ImportError(f"kvtier.gpu: kvt_gpu_layout_desc is {size} bytes in the library, "
                          f"{ctypes.sizeof(kvt_gpu_layout_desc)} in this binding")


_declare()


def _torch() -> Any:
    try:
        torch = importlib.import_module("torch")  # optional: no stubs needed
    except ImportError as e:
        raise ImportError("kvtier.gpu: a PagedKV works on torch CUDA tensors; install torch "
                          "(the rest of kvtier needs no torch)") from e
    return torch


# --- layouts -----------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where K and V of (block, token, head) live in each layer's tensor: the
    fields of kvt_gpu_layout_desc that PagedKV derives from the tensors.
    Strides and offsets are in elements; the head_dim elements of a head are
    contiguous. V of a layer starts v_offset elements after its K."""

    num_blocks: int
    block_size: int
    heads: int
    head_dim: int
    stride_block: int
    stride_token: int
    stride_head: int
    k_offset: int
    v_offset: int


LAYOUTS: Tuple[str, ...] = ("vllm", "vllm-legacy")


def layout_of(shape: Sequence[int], stride: Sequence[int], layout: str = "vllm") -> Layout:
    """The Layout of one layer's tensor from its shape and element strides
    (tensor.shape, tensor.stride()).

    layout:
      "vllm": current vLLM (0.33, every KVCacheLayout: NHD, HND, block-outer
          and padded pages alike): logical shape [num_blocks, heads,
          block_size, 2*head_dim], K in [..., :head_dim], V in
          [..., head_dim:] (what vLLM's attention backends are handed).
      "vllm-legacy": vLLM's earlier flash-attn cache [2, num_blocks,
          block_size, heads, head_dim], K then V.

    Raises Error(KVT_ESHAPE) for a shape the layout does not have or strides
    the kernels cannot follow (a head_dim row that is not contiguous),
    ValueError for an unknown layout name.
    """
    shape, stride = tuple(int(x) for x in shape), tuple(int(x) for x in stride)
    if layout == "vllm":
        if len(shape) != 4 or shape[3] % 2:
            raise Error(ErrorCode.ESHAPE, detail=f"a current vLLM layer cache is [num_blocks, "
                        f"heads, block_size, 2*head_dim]; got shape {shape}")
        blocks, heads, bs, c = shape
        d = c // 2
        if c > 1 and stride[3] != 1:
            raise Error(ErrorCode.ESHAPE, detail=f"K/V rows must be contiguous (last stride 1), "
                        f"got strides {stride}")
        return Layout(blocks, bs, heads, d, stride[0], stride[2], stride[1], 0, d)
    if layout == "vllm-legacy":
        if len(shape) != 5 or shape[0] != 2:
            raise Error(ErrorCode.ESHAPE, detail=f"a legacy vLLM layer cache is [2, num_blocks, "
                        f"block_size, heads, head_dim]; got shape {shape}")
        _, blocks, bs, heads, d = shape
        if d > 1 and stride[4] != 1:
            raise Error(ErrorCode.ESHAPE, detail=f"head_dim rows must be contiguous (last "
                        f"stride 1), got strides {stride}")
        return Layout(blocks, bs, heads, d, stride[1], stride[2], stride[3], 0, stride[0])
    raise ValueError(f"kvtier: layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


def vllm_layout_name(name: str) -> str:
    """A KVCacheLayout name ("LBNHC", ...) from it or its legacy alias ("NHD", "HND")."""
    n = _VLLM_ALIASES.get(name.upper(), name.upper())
    if n not in VLLM_LAYOUTS:
        raise ValueError(f"kvtier: vLLM KV cache layout {name!r}: expected one of "
                         f"{', '.join(VLLM_LAYOUTS)} (or NHD, HND)")
    return n


def vllm_layer_view(pages: Any, *, layout: str, num_kv_heads: int, block_size: int,
                    head_size: int, dtype: Any) -> Any:
    """The [num_blocks, num_kv_heads, block_size, 2*head_size] tensor of
    `dtype` that vLLM's attention backends see, over one layer's canonical
    pages: a (num_blocks, page_bytes) int8 CUDA tensor whose row b is block
    b's page (stride(0) the block stride in bytes), as vLLM's
    OffloadingConnector hands an OffloadingSpec's worker
    (CanonicalKVCacheTensor.tensor). `layout` is vLLM's resolved KV cache
    layout (vllm_config.cache_config.kv_cache_layout: "LBNHC", "LBHNC",
    "BLNHC", "BLHNC", or "NHD"/"HND"); a layout whose page is not one
    contiguous run (LHBNC, BHLNC) raises Error(KVT_ENOTSUP). Shares the
    memory of `pages`; pass the result to PagedKV."""
    torch = _torch()
    name = vllm_layout_name(layout)
    if name in ("LHBNC", "BHLNC"):
        raise Error(ErrorCode.ENOTSUP, detail=f"vLLM layout {name}: a block's page is not one "
                    "contiguous run, so canonical (num_blocks, page) tensors cannot describe it")
    if pages.dim() != 2 or pages.element_size() != 1 or pages.stride(1) != 1:
        raise Error(ErrorCode.ESHAPE, detail=f"canonical pages are a (num_blocks, page_bytes) "
                    f"byte tensor with stride (block_stride, 1); got {tuple(pages.shape)} "
                    f"{pages.dtype} strides {tuple(pages.stride())}")
    elem = torch.empty((), dtype=dtype).element_size()
    c = 2 * head_size
    page = num_kv_heads * block_size * c * elem
    if pages.shape[1] < page:
        raise Error(ErrorCode.ESHAPE, detail=f"pages of {pages.shape[1]} bytes cannot hold "
                    f"{num_kv_heads} heads x {block_size} tokens x {c} x {elem}-byte elements")
    off = pages.storage_offset()
    if pages.stride(0) % elem or off % elem:
        raise Error(ErrorCode.ESHAPE, detail=f"block stride {pages.stride(0)} or offset {off} "
                    f"bytes is not a whole number of {elem}-byte elements")
    nhc = name.endswith("NHC")  # token-major pages ("NHD"); else head-major ("HND")
    s_head, s_token = (c, num_kv_heads * c) if nhc else (block_size * c, c)
    view = torch.empty(0, dtype=dtype, device=pages.device)
    return view.set_(pages.untyped_storage(), off // elem,
                     (pages.shape[0], num_kv_heads, block_size, c),
                     (pages.stride(0) // elem, s_head, s_token, 1))


def check_vllm_spec(spec: Any) -> None:
    """Raises Error(KVT_ENOTSUP) with the reason when a vLLM KVCacheSpec
    (duck-typed; vLLM need not be importable) describes a cache that kvtier
    cannot store: MLA (one latent per token, no separate V), a quantized
    cache (kv_cache_dtype fp8 and the other KVQuantMode modes), K and V of
    different head sizes, or no attention cache at all (Mamba states)."""
    name = type(spec).__name__
    if "MLA" in name:
        raise Error(ErrorCode.ENOTSUP, detail=f"{name}: MLA caches one latent vector per token "
                    "(no separate K and V); kvtier's codecs store K/V caches")
    if not hasattr(spec, "num_kv_heads") or not hasattr(spec, "head_size"):
        raise Error(ErrorCode.ENOTSUP, detail=f"{name}: not an attention KV cache (Mamba and "
                    "other state caches are not stored by kvtier)")
    mode = getattr(spec, "kv_quant_mode", 0)
    if int(getattr(mode, "value", mode) or 0) != 0:
        raise Error(ErrorCode.ENOTSUP, detail=f"{name}: a quantized KV cache ({mode}); kvtier "
                    "stores bf16/fp16 caches (kv_cache_dtype auto) and compresses them itself")
    hv = getattr(spec, "head_size_v", spec.head_size)
    if hv != spec.head_size:
        raise Error(ErrorCode.ENOTSUP, detail=f"{name}: K head size {spec.head_size} and V "
                    f"head size {hv} differ")
    dt = str(getattr(spec, "dtype", "bfloat16")).replace("torch.", "")
    if dt not in ("bfloat16", "float16"):
        raise Error(ErrorCode.ENOTSUP, detail=f"{name}: cache dtype {dt}; kvtier stores bf16 "
                    "and fp16 caches")


# --- pinned host memory --------------------------------------------------------


class PinnedBuffer:
    """nbytes of host memory, page-locked and mapped into the GPU
    (kvt_gpu_host_register), for payloads: what store() writes and load()
    reads at full PCIe speed. `array` is a numpy uint8 view of it, which
    Cache.put / Cache.get_into take. close() (or the end of a with block, or
    garbage collection) unregisters it; no GPU work may still use it then.
    Raises Error(KVT_ENOTSUP) without CUDA or a device."""

    def __init__(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError("kvtier: a PinnedBuffer needs at least one byte")
        raw = np.empty(int(nbytes) + 4096, np.uint8)
        start = (-raw.ctypes.data) % 4096
        self.array: np.ndarray = raw[start:start + int(nbytes)]
        self.ptr: int = int(self.array.ctypes.data)
        self.nbytes: int = int(nbytes)
        ctx = Context()
        ctx.call(lib.kvt_gpu_host_register, self.ptr, self.nbytes)
        self._finalizer = weakref.finalize(self, PinnedBuffer._release, ctx, self.ptr, raw)

    @staticmethod
    def _release(ctx: Context, ptr: int, raw: np.ndarray) -> None:
        lib.kvt_gpu_host_unregister(ctx.handle, ptr)
        ctx.close()
        del raw

    def close(self) -> None:
        """Unregisters the memory (idempotent)."""
        self._finalizer()

    def __len__(self) -> int:
        return self.nbytes

    def __enter__(self) -> "PinnedBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def mem_kind(ptr: int) -> int:
    """Where ptr lives: MEM_PAGEABLE, MEM_PINNED or MEM_DEVICE (kvt_gpu_mem_kind)."""
    out = c_int(-1)
    ctx().call(lib.kvt_gpu_mem_kind, ptr, ctypes.byref(out))
    return int(out.value)


def _buffer(obj: Any, writable: bool) -> Tuple[int, int, Any]:
    """(address, bytes, keepalive) of a payload buffer: a PinnedBuffer, a
    contiguous torch tensor (pinned host or CUDA), or a buffer numpy can
    view (whose memory the library then checks is pinned)."""
    if isinstance(obj, PinnedBuffer):
        return obj.ptr, obj.nbytes, obj
    if type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr"):
        if not obj.is_contiguous():
            raise ValueError("kvtier: a payload tensor must be contiguous")
        return int(obj.data_ptr()), int(obj.numel() * obj.element_size()), obj
    return write_buffer(obj) if writable else read_buffer(obj)


def _cuda_event(ev: Any, stream: Any) -> int:
    """The cudaEvent_t of a torch.cuda.Event (or a raw handle as int)."""
    if isinstance(ev, int):
        return ev
    if not getattr(ev, "cuda_event", 0):
        ev.record(stream)  # torch creates its CUDA event at the first record
    handle = int(getattr(ev, "cuda_event", 0) or 0)
    if not handle:
        raise TypeError(f"kvtier: {ev!r} is not a torch.cuda.Event with a CUDA event")
    return handle


# --- transfers -----------------------------------------------------------------


class Transfer:
    """A store or load launched on a stream. It keeps what the GPU still
    reads or writes (the slot mapping, the payload buffer) alive until the
    stream has passed it."""

    def __init__(self, event: Any, keep: List[Any],
                 check: Optional[Callable[[], None]] = None) -> None:
        self._event = event
        self._keep: Optional[List[Any]] = keep
        self._check = check  # a load verified on the GPU: reads its verdict
        self._failed: Optional[BaseException] = None  # what the verdict said

    def _passed(self) -> None:
        check, self._check = self._check, None
        try:
            if check is not None:
                check()
        except BaseException as e:
            self._failed = e
        finally:
            self._keep = None
        if self._failed is not None:
            raise self._failed  # every time it is asked, not only the first

    def __del__(self) -> None:
        # Dropped before the stream passed it: the GPU may still write the
        # verdict and read the payload that _keep holds alive.
        if getattr(self, "_check", None) is not None and self._keep is not None:
            try:
                self._event.synchronize()
            except Exception:  # interpreter shutdown, a dead context
                pass

    def done(self) -> bool:
        """Whether the GPU has finished the work (no waiting). For a load
        verified on the GPU, the first True also checks its verdict and
        raises Error (KVT_ECHECKSUM) if a section did not match."""
        ok = bool(self._event.query())
        if ok:
            self._passed()
        return ok

    def wait(self) -> None:
        """Blocks the host until the GPU has finished the work; then, for a
        load verified on the GPU, raises Error (KVT_ECHECKSUM: treat the
        chunk as a miss) if a section did not match."""
        self._event.synchronize()
        self._passed()


class BatchTransfer(Transfer):
    """Payloads loaded by PagedKV.load_batch(): wait() raises the first
    failed verdict (naming the payload's index), verdicts() gives each
    payload's outcome."""

    def __init__(self, kv: "PagedKV", loader: "_Handle", event: Any, keep: List[Any],
                 verdicts: Any, n: int) -> None:
        self._kv = kv
        self._loader = loader
        self._verdicts = verdicts
        self._n = n
        self._outcomes: Optional[List[Optional[Error]]] = None
        super().__init__(event, keep + [verdicts], self._check_all)

    def _check_all(self) -> None:
        first = next((e for e in self._read() if e is not None), None)
        if first is not None:
            raise first

    def _read(self) -> List[Optional[Error]]:
        if self._outcomes is None:
            vsize = ctypes.sizeof(kvt_gpu_verdict)
            out: List[Optional[Error]] = []
            for i in range(self._n):
                try:
                    self._kv._call(self._loader, lib.kvt_gpu_verdict_check,
                                   self._verdicts.data_ptr() + i * vsize)
                    out.append(None)
                except Error as e:
                    out.append(Error(e.code, detail=f"load_many payload {i}: {e.detail}"))
            self._outcomes = out
        return self._outcomes

    def verdicts(self) -> List[Optional[Error]]:
        """Waits for the loads; each payload's outcome: None (loaded and
        verified) or the Error of its failed verdict (a miss)."""
        self._event.synchronize()
        out = self._read()
        try:
            self._passed()
        except Error:
            pass  # reported per payload
        return out


class StoreJob(Transfer):
    """A store launched by PagedKV.store_async(): finish() it once (after
    done() says True, or to wait), then the payload's `length` bytes at
    the destination are valid."""

    def __init__(self, kv: "PagedKV", handle: "_Handle", event: Any, keep: List[Any], dst: int,
                 length: int) -> None:
        super().__init__(event, keep)
        self._kv: Optional[PagedKV] = kv
        self._handle = handle
        self._dst = dst
        self.length = length

    def finish(self) -> int:
        """Waits for this store (only: later work on its stream is not waited
        for), checks the kernel's verdict and seals a host payload's
        checksums; returns the payload's length. Raises Error:
        KVT_ENONFINITE (a NaN/Inf to be quantized, named by layer, token,
        head and dim), KVT_ERANGE, KVT_ECUDA."""
        kv = self._kv
        if kv is None:
            return self.length
        self._event.synchronize()
        self._kv = None
        self._keep = None
        try:
            # The store's work is complete (its event): finishing on an idle
            # stream reads the verdict without waiting for work queued after
            # it on the caller's stream.
            kv._call(self._handle, lib.kvt_gpu_store_finish, self._dst, self.length,
                     kv._idle_stream_ptr())
        finally:
            self._handle.busy = False
        return self.length


class _Handle:
    """One kvt_gpu_layout, with the context that holds the detail of its
    calls and the lock that keeps them one at a time (kvtier/gpu.h)."""

    def __init__(self, desc: kvt_gpu_layout_desc) -> None:
        self.ctx = Context()
        self.lock = threading.Lock()
        self.ptr = c_void_p()
        self.busy = False  # a store of it is unfinished
        try:
            self.ctx.call(lib.kvt_gpu_layout_create, ctypes.byref(desc), ctypes.byref(self.ptr))
        except BaseException:
            self.ctx.close()
            raise

    def call(self, fn: Any, *args: Any) -> int:
        with self.lock:
            if not self.ptr:
                raise ValueError("kvtier: the PagedKV is closed")
            return self.ctx.check(fn(self.ptr, *args))

    def close(self) -> None:
        with self.lock:
            ptr, self.ptr = self.ptr, c_void_p()
            if ptr:
                lib.kvt_gpu_layout_destroy(ptr)
            self.ctx.close()


# --- the handle ----------------------------------------------------------------


class PagedKV:
    """An engine's paged KV cache on one GPU, registered with kvtier
    (kvt_gpu_layout_create): store() block ids into payloads, load()
    payloads into block ids.

    layers: one CUDA tensor per layer, all of one shape, strides, dtype
        (bfloat16 or float16) and device: vLLM's per-layer caches (layout
        "vllm": [num_blocks, heads, block_size, 2*head_dim], any
        KVCacheLayout; vllm_layer_view() builds them from vLLM's canonical
        pages) or "vllm-legacy" ([2, num_blocks, block_size, heads,
        head_dim]). The layout is derived from each tensor's shape and
        strides (layout_of); the tensors are kept alive by the handle.
    head_dim: when given, the cache must have it (2*head_dim == the last
        axis for "vllm"): a cache of head_dim elements per token is MLA's
        latent (KVT_ENOTSUP).
    layer_begin: the absolute model layer of layers[0] (pipeline stages).
    model_layers: layers of the whole model (0: layer_begin + len(layers));
        payloads record it.
    staging_bytes: device memory for staged loads from pinned host memory
        (STAGING_DEFAULT; 0 for none: the kernel then reads host memory).
    store_handles: how many stores may be in flight at once (each holds a
        small device status word): their host-side sealing (the payload's
        section checksums, bound by one CPU core each) runs in parallel in
        store_many().
    load_handles: how many loads may be launched at once from different
        threads, each with its own staging_bytes of device memory and copy
        stream (a staged load's call lasts until its last piece is queued,
        and calls on one handle take turns).

    Block ids index the tensors' first (block) axis; token t of a transfer
    of block ids B is token t % block_size of block B[t // block_size].
    A handle may be used by several threads (calls are serialized); one
    store per store_handles is in flight at a time, loads on several
    streams at once.
    Raises Error: KVT_ENOTSUP (fp8 or other quantized dtypes, MLA, a
    library without CUDA), KVT_ESHAPE (a layout the kernels cannot follow,
    layers that differ), KVT_ECUDA.
    """

    def __init__(self, layers: Sequence[Any], *, layout: str = "vllm",
                 head_dim: Optional[int] = None, layer_begin: int = 0, model_layers: int = 0,
                 staging_bytes: int = STAGING_DEFAULT, store_handles: int = 4,
                 load_handles: int = 1) -> None:
        torch = _torch()
        self._tensors = list(layers)
        if not self._tensors:
            raise ValueError("kvtier: a PagedKV needs at least one layer")
        t0 = self._tensors[0]
        for i, t in enumerate(self._tensors):
            if not isinstance(t, torch.Tensor) or not t.is_cuda:
                raise TypeError(f"kvtier: layer {i} is not a CUDA tensor")
            if t.dtype != t0.dtype or t.shape != t0.shape or t.stride() != t0.stride() \
                    or t.device != t0.device:
                raise Error(ErrorCode.ESHAPE, detail=f"layer {i} is {t.dtype} {tuple(t.shape)} "
                            f"strides {t.stride()} on {t.device}; layer 0 is {t0.dtype} "
                            f"{tuple(t0.shape)} strides {t0.stride()} on {t0.device}")
        dt = str(t0.dtype).replace("torch.", "")
        if dt not in ("bfloat16", "float16"):
            raise Error(ErrorCode.ENOTSUP, detail=f"a {dt} KV cache: kvtier stores bf16 and fp16 "
                        "caches (vLLM kv_cache_dtype auto) and quantizes them itself; fp8 and "
                        "other quantized engine caches are not supported")
        lay = layout_of(t0.shape, t0.stride(), layout)
        if head_dim is not None and lay.head_dim != head_dim:
            mla = layout == "vllm" and 2 * lay.head_dim == head_dim
            raise Error(ErrorCode.ENOTSUP if mla else ErrorCode.ESHAPE,
                        detail=(f"{head_dim} elements per token and head: MLA's latent cache "
                                "(no separate V) is not supported" if mla else
                                f"head_dim {head_dim} expected, the tensors hold {lay.head_dim}"))
        self.layout: Layout = lay
        self.device = t0.device
        self.dtype = t0.dtype
        self.layers = len(self._tensors)
        self.layer_begin = int(layer_begin)
        self.model_layers = int(model_layers) or self.layer_begin + self.layers
        self._pick = threading.Lock()
        self._idle: Any = None
        ptrs = (c_void_p * self.layers)(*[t.data_ptr() for t in self._tensors])
        d = S.init(kvt_gpu_layout_desc)
        d.dtype = 1 if dt == "bfloat16" else 2
        d.layers, d.layer_begin = self.layers, self.layer_begin
        d.heads, d.head_dim = lay.heads, lay.head_dim
        d.block_size, d.num_blocks = lay.block_size, lay.num_blocks
        d.stride_block, d.stride_token, d.stride_head = (lay.stride_block, lay.stride_token,
                                                         lay.stride_head)
        d.k_offset, d.v_offset = lay.k_offset, lay.v_offset
        d.k_layers = ctypes.cast(ptrs, POINTER(c_void_p))
        self._handles: List[_Handle] = []
        self._finalizer = weakref.finalize(self, PagedKV._release, self._handles)
        n_load = max(1, int(load_handles))
        self._loaders: "queue.SimpleQueue[_Handle]" = queue.SimpleQueue()
        with torch.cuda.device(self.device):
            for i in range(max(1, int(store_handles), n_load)):
                d.staging_bytes = staging_bytes if i < n_load else 0  # the first ones load
                self._handles.append(_Handle(d))
                if i < n_load:
                    self._loaders.put(self._handles[-1])

    @staticmethod
    def _release(handles: List[_Handle]) -> None:
        for h in handles:
            h.close()

    def close(self) -> None:
        """Frees the handle's device memory (idempotent). No transfer of it
        may be in flight."""
        self._finalizer()

    def __enter__(self) -> "PagedKV":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- geometry ---------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks

    @property
    def block_size(self) -> int:
        return self.layout.block_size

    @property
    def heads(self) -> int:
        return self.layout.heads

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    # --- plumbing -----------------------------------------------------------------

    def _call(self, handle: Optional[_Handle], fn: Any, *args: Any) -> int:
        """fn(layout, *args) on handle (None: the loading one), raising Error."""
        if not self._handles:
            raise ValueError("kvtier: the PagedKV is closed")
        with _torch().cuda.device(self.device):
            return (handle or self._handles[0]).call(fn, *args)

    def _stream(self, stream: Any) -> Tuple[Any, int]:
        """(torch stream, cudaStream_t) of the caller's stream argument."""
        torch = _torch()
        if stream is None:
            s = torch.cuda.current_stream(self.device)
        elif isinstance(stream, int):
            s = torch.cuda.ExternalStream(stream, device=self.device)
        else:
            s = stream
        return s, int(s.cuda_stream)

    def _idle_stream_ptr(self) -> int:
        if self._idle is None:
            self._idle = _torch().cuda.Stream(self.device)
        return int(self._idle.cuda_stream)

    def _slots(self, block_ids: Any, num_tokens: Optional[int]) -> Tuple[Any, int]:
        """The slot mapping of block_ids as an int64 CUDA tensor, made on the
        current stream (the caller's, inside torch.cuda.stream): one small
        host-to-device copy for host ids, two kernels for CUDA ids."""
        torch = _torch()
        bs = self.block_size
        if isinstance(block_ids, torch.Tensor) and block_ids.is_cuda:
            ids = block_ids.to(self.device, torch.int64).reshape(-1)
            n = ids.numel() * bs if num_tokens is None else int(num_tokens)
            if n <= 0 or n > ids.numel() * bs:
                raise ValueError(f"kvtier: {n} tokens from {ids.numel()} blocks of {bs}")
            slots = (ids[:, None] * bs + torch.arange(bs, device=self.device)).reshape(-1)
            return slots[:n].contiguous(), n
        a = np.asarray(block_ids.cpu() if isinstance(block_ids, torch.Tensor) else block_ids)
        a = a.astype(np.int64, copy=False).reshape(-1)
        n = a.size * bs if num_tokens is None else int(num_tokens)
        if n <= 0 or n > a.size * bs:
            raise ValueError(f"kvtier: {n} tokens from {a.size} blocks of {bs}")
        if int(a.min()) < 0 or int(a.max()) >= self.num_blocks:
            raise ValueError(f"kvtier: block ids must be in [0, {self.num_blocks}); got "
                             f"{int(a.min())}..{int(a.max())}")
        host = (a[:, None] * bs + np.arange(bs, dtype=np.int64)).reshape(-1)[:n]
        return torch.from_numpy(host).pin_memory().to(self.device, non_blocking=True), n

    def _layers(self, layer_begin: Optional[int], layer_count: Optional[int]) -> Tuple[int, int]:
        lb = self.layer_begin if layer_begin is None else int(layer_begin)
        n = self.layer_begin + self.layers - lb if layer_count is None else int(layer_count)
        return lb, n

    # --- store ----------------------------------------------------------------------

    def store_bound(self, num_tokens: int, codec: Codec = "k16v8", *,
                    layer_begin: Optional[int] = None,
                    layer_count: Optional[int] = None) -> int:
        """Bytes the payload of a store of num_tokens tokens takes (exact)."""
        lb, n = self._layers(layer_begin, layer_count)
        ep = _encode_params(codec_spec(codec), None, None, lb, self.model_layers, 0, 0)
        sp = S.init(kvt_gpu_store_params)
        sp.encode = ctypes.pointer(ep)
        sp.layer_count, sp.tokens, sp.slots = n, int(num_tokens), 16  # not read
        out = c_uint64()
        self._call(None, lib.kvt_gpu_store_bound, ctypes.byref(sp), ctypes.byref(out))
        return int(out.value)

    def store_async(self, block_ids: Any, out: Any, *, codec: Codec = "k16v8",
                    key: Optional[KeyLike] = None, fingerprint: Optional[KeyLike] = None,
                    token_begin: int = 0, num_tokens: Optional[int] = None,
                    layer_begin: Optional[int] = None, layer_count: Optional[int] = None,
                    stream: Any = None) -> StoreJob:
        """Launches the store of the tokens of block_ids (all their
        block_size tokens, or the first num_tokens) into `out` on `stream`
        and returns without waiting; StoreJob.finish() completes it.

        block_ids: a sequence, numpy array or torch tensor of block indices
            (a CUDA tensor is used as it is, unchecked).
        out: a PinnedBuffer, a pinned host or CUDA uint8 tensor, at least
            store_bound() bytes, not in use by queued GPU work.
        codec: a preset ("k16v8", "raw", "fp8", "int4", ...) or spec.
        key, fingerprint, token_begin: what the payload records (as
            kvtier.encode()).
        layer_begin, layer_count: absolute layers stored (default: all).
        stream: torch.cuda.Stream, a raw cudaStream_t, or None for the
            current stream. Work queued on it before runs first.

        Raises Error: KVT_ESPEC, KVT_ESHAPE, KVT_ENOBUFS, KVT_ENOTSUP
        (pageable `out`), KVT_ECUDA; RuntimeError while store_handles stores
        of this PagedKV are unfinished.
        """
        with self._pick:
            handle = next((h for h in self._handles if not h.busy), None)
            if handle is None:
                raise RuntimeError(f"kvtier: {len(self._handles)} stores of this PagedKV are "
                                   "unfinished (store_handles): finish() one first")
            handle.busy = True
        try:
            return self._store_async(handle, block_ids, out, codec, key, fingerprint,
                                     token_begin, num_tokens, layer_begin, layer_count, stream)
        except BaseException:
            handle.busy = False
            raise

    def _store_async(self, handle: _Handle, block_ids: Any, out: Any, codec: Codec,
                     key: Optional[KeyLike], fingerprint: Optional[KeyLike], token_begin: int,
                     num_tokens: Optional[int], layer_begin: Optional[int],
                     layer_count: Optional[int], stream: Any) -> StoreJob:
        torch = _torch()
        lb, n_layers = self._layers(layer_begin, layer_count)
        ep = _encode_params(codec_spec(codec), None if key is None else Key(key),
                            None if fingerprint is None else Key(fingerprint), lb,
                            self.model_layers, token_begin, 0)
        dst, cap, keep = _buffer(out, writable=True)
        ts, sptr = self._stream(stream)
        with torch.cuda.stream(ts):
            slots, n = self._slots(block_ids, num_tokens)
            sp = S.init(kvt_gpu_store_params)
            sp.encode = ctypes.pointer(ep)
            sp.layer_count, sp.tokens, sp.slots = n_layers, n, slots.data_ptr()
            length = c_size_t()
            self._call(handle, lib.kvt_gpu_store_async, ctypes.byref(sp), dst, cap,
                       ctypes.byref(length), sptr)
            ev = torch.cuda.Event()
            ev.record(ts)
        return StoreJob(self, handle, ev, [slots, keep, ep], dst, int(length.value))

    def store(self, block_ids: Any, out: Any, **kw: Any) -> int:
        """store_async(...).finish(): stores and returns the payload's
        length once it is sealed and valid. Arguments as store_async()."""
        return self.store_async(block_ids, out, **kw).finish()

    def store_many(self, block_ids: Sequence[Any], outs: Sequence[Any], *,
                   keys: Optional[Sequence[Optional[KeyLike]]] = None,
                   token_begins: Optional[Sequence[int]] = None, **kw: Any) -> List[int]:
        """Stores several chunks (block_ids[i] into outs[i], with keys[i] and
        token_begins[i]) on one stream, the kernels back to back while the
        finished ones are sealed on store_handles host threads; returns
        their lengths once all are valid. Other keyword arguments as
        store_async(). Raises the first Error after the stores launched
        before it are finished (their payloads are valid)."""
        if len(block_ids) != len(outs):
            raise ValueError("kvtier: store_many needs one output per chunk")
        lengths: List[int] = []
        pending: Deque["Future[int]"] = deque()
        with ThreadPoolExecutor(len(self._handles)) as pool:
            try:
                for i, (ids, out) in enumerate(zip(block_ids, outs)):
                    if len(pending) == len(self._handles):
                        lengths.append(pending.popleft().result())
                    job = self.store_async(ids, out, key=keys[i] if keys else None,
                                           token_begin=token_begins[i] if token_begins else 0,
                                           **kw)
                    pending.append(pool.submit(job.finish))
            finally:
                done = [f.exception() or f.result() for f in pending]
            for d in done:
                if isinstance(d, BaseException):
                    raise d
                lengths.append(d)
        return lengths

    # --- load -----------------------------------------------------------------------

    def load(self, payload: Any, block_ids: Any, *, length: Optional[int] = None,
             num_tokens: Optional[int] = None, layer_first: int = 0, layer_count: int = 0,
             layer_events: Optional[Sequence[Any]] = None,
             expect_key: Optional[KeyLike] = None,
             expect_fingerprint: Optional[KeyLike] = None, trust: bool = False,
             verify_on_gpu: bool = False, stream: Any = None) -> Transfer:
        """Checks the payload and launches its load into the slots of
        block_ids on `stream`; returns once launched (Transfer.wait() or
        the stream's order tells when the KV is in place).

        payload: a PinnedBuffer or pinned host tensor (checked on the host
            before launch: header, key, fingerprint, every loaded section's
            checksum), or a CUDA uint8 tensor (header checked on the host,
            sections' checksums on the GPU, waiting for the stream).
        length: the payload's bytes at the start of the buffer (default: the
            whole buffer).
        block_ids, num_tokens: the destination, as store_async(); the token
            count must be the payload's.
        layer_first, layer_count: the payload's layers loaded (relative; 0:
            all from layer_first on).
        layer_events: torch.cuda.Event objects, one per layer loaded (their
            number is the layer count): event i is recorded after layer
            layer_first + i, so compute on layer l can start while later
            layers load (event.wait(stream)).
        expect_key, expect_fingerprint: refuse another chunk's or model's
            payload (KVT_EFOREIGN).
        trust: skip the section checksums (the caller verified the bytes,
            e.g. kvtier.verify(), and nothing wrote them since).
        verify_on_gpu: the section checksums are computed by the GPU as the
            payload moves (a host payload is staged through device memory
            and hashed there), in stream order, instead of on the host
            before the launch: the returned Transfer's wait() (or done(),
            once True) raises Error KVT_ECHECKSUM if a section did not match,
            every time it is called. Call one of them before using the
            loaded KV: layer_events fire before the verdict is known. The
            load kernel of a piece that failed writes nothing, but other
            layers may be loaded: treat the chunk as a miss and recompute
            it. The header, key, fingerprint and shape are still checked
            before the launch (errors raised here).

        Raises Error: KVT_ECHECKSUM, KVT_ETRUNC, KVT_EFORMAT, KVT_ECORRUPT
        (a damaged payload: nothing was written), KVT_EFOREIGN, KVT_ESHAPE
        (another shape or token count), KVT_ENOTSUP (pageable memory, zstd
        sections), KVT_ECUDA.
        """
        torch = _torch()
        src, nbytes, keep = _buffer(payload, writable=False)
        n_bytes = nbytes if length is None else int(length)
        if n_bytes > nbytes:
            raise ValueError(f"kvtier: length {n_bytes} exceeds the buffer's {nbytes} bytes")
        ts, sptr = self._stream(stream)
        lp = S.init(kvt_gpu_load_params)
        refs: List[Any] = []
        for name, k in (("expect_key", expect_key), ("expect_fingerprint", expect_fingerprint)):
            if k is not None:
                c = Key(k).struct
                refs.append(c)
                setattr(lp, name, ctypes.pointer(c))
        lp.layer_first, lp.layer_count = int(layer_first), int(layer_count)
        lp.flags = (LOAD_TRUST_HOST | LOAD_TRUST_DEVICE) if trust else 0
        verdict = None
        if verify_on_gpu and not trust:
            # Pinned (mapped) host memory the GPU writes the outcome into.
            verdict = torch.zeros(ctypes.sizeof(kvt_gpu_verdict), dtype=torch.uint8,
                                  pin_memory=True)
            lp.verdict = verdict.data_ptr()
        events = None
        if layer_events is not None:
            if layer_count and layer_count != len(layer_events):
                raise ValueError(f"kvtier: {len(layer_events)} layer events for {layer_count} "
                                 "layers: give one event per layer loaded")
            lp.layer_count = len(layer_events)
            events = (c_void_p * max(len(layer_events), 1))(
                *[_cuda_event(ev, ts) for ev in layer_events])
            lp.layer_events = ctypes.cast(events, POINTER(c_void_p))
        with torch.cuda.stream(ts):
            slots, n = self._slots(block_ids, num_tokens)
            lp.tokens, lp.slots = n, slots.data_ptr()
            loader, done = self._launch_load(ts, lib.kvt_gpu_load, src, n_bytes,
                                             ctypes.byref(lp), sptr)
        return Transfer(done, [slots, keep, refs, events, verdict],
                        self._verdict_check(loader, verdict))

    def load_many(self, payloads: Sequence[Any], block_ids: Sequence[Any], *,
                  lengths: Optional[Sequence[Optional[int]]] = None,
                  keys: Optional[Sequence[Optional[KeyLike]]] = None,
                  expect_fingerprint: Optional[KeyLike] = None, threads: int = 4,
                  verify_on_gpu: bool = False, stream: Any = None) -> Transfer:
        """Loads several payloads (payloads[i], lengths[i] bytes, into
        block_ids[i], expecting keys[i]) on one stream. Host payloads are
        verified (every section's checksum, kvtier.verify) on `threads` host
        threads while the ones before them load, each launched as soon as it
        and those before it are verified; device payloads are checked on the
        GPU. With verify_on_gpu every payload's sections are verified by the
        GPU as it loads, and the returned Transfer's wait() raises the first
        failed verdict (naming the payload's index); payloads in pinned host
        memory of one geometry (codec, layers, token count) are then loaded
        by batched launches (kvt_gpu_load_batch: a layer range of up to 64
        chunks a kernel), others one call each (load()). Returns one
        Transfer for all. Raises the first Error (a damaged, foreign or
        misshapen payload): the payloads before it are loaded, none after it
        (treat the whole set as not loaded; batched: none is)."""
        from .payload import verify

        n = len(payloads)
        if len(block_ids) != n:
            raise ValueError("kvtier: load_many needs block ids for every payload")
        views = []
        for i, p in enumerate(payloads):
            addr, nbytes, keep = _buffer(p, writable=False)
            given = lengths[i] if lengths else None
            ln = nbytes if given is None else int(given)
            if ln > nbytes:
                raise ValueError(f"kvtier: length {ln} exceeds payload {i}'s {nbytes} bytes")
            host = mem_kind(addr) != MEM_DEVICE
            views.append((np.ctypeslib.as_array((ctypes.c_uint8 * ln).from_address(addr))
                          if host else None, ln, keep))
        if verify_on_gpu and n and all(v[0] is not None for v in views):
            batched = self._load_batch(payloads, block_ids, [v[1] for v in views], keys,
                                       expect_fingerprint, stream)
            if batched is not None:
                return batched
        if verify_on_gpu:
            loads: List[Transfer] = []
            try:
                for i in range(n):
                    loads.append(self.load(payloads[i], block_ids[i], length=views[i][1],
                                           expect_key=keys[i] if keys else None,
                                           expect_fingerprint=expect_fingerprint,
                                           verify_on_gpu=True, stream=stream))
            except BaseException:
                for t in loads:  # launched: let the GPU finish with their verdicts
                    try:
                        t.wait()
                    except Error:
                        pass
                raise
            if not loads:
                raise ValueError("kvtier: load_many of no payloads")

            def check_all() -> None:
                for t in loads:
                    t.wait()  # the stream passed the last one: no waiting

            return Transfer(loads[-1]._event, [views, loads], check_all)
        last: Optional[Transfer] = None
        with ThreadPoolExecutor(max(1, threads)) as pool:
            checks = [pool.submit(verify, v[0]) if v[0] is not None else None for v in views]
            try:
                for i, (view, ln, _) in enumerate(views):
                    check = checks[i]
                    if check is not None:
                        check.result()
                    last = self.load(payloads[i], block_ids[i], length=ln,
                                     expect_key=keys[i] if keys else None,
                                     expect_fingerprint=expect_fingerprint,
                                     trust=check is not None, stream=stream)
            finally:
                for c in checks:
                    if c is not None:
                        c.cancel()
        if last is None:
            raise ValueError("kvtier: load_many of no payloads")
        return Transfer(last._event, [views, last._keep])

    def load_batch(self, payloads: Sequence[Any], block_ids: Sequence[Any], *,
                   lengths: Optional[Sequence[Optional[int]]] = None,
                   keys: Optional[Sequence[Optional[KeyLike]]] = None,
                   expect_fingerprint: Optional[KeyLike] = None,
                   stream: Any = None) -> "BatchTransfer":
        """Loads payloads of one geometry (codec, layers, token count) in
        pinned host memory into block_ids[i] with kvt_gpu_load_batch: kernels
        that each load a layer range of up to 64 chunks, every chunk's
        sections verified on the GPU with a verdict of its own. Returns once
        launched; BatchTransfer.verdicts() waits and gives each payload's
        outcome (None, or the Error that makes it a miss: its failing piece
        was not written, its other layers may be). Raises Error, launching
        nothing, for a payload that fails the checks made before the launch
        (the detail names "item i"), KVT_ESHAPE with "one geometry" in the
        detail when the payloads differ in geometry, KVT_ENOTSUP for device
        memory."""
        torch = _torch()
        n = len(payloads)
        if n == 0 or len(block_ids) != n:
            raise ValueError("kvtier: load_batch needs payloads, and block ids for each")
        ts, sptr = self._stream(stream)
        vsize = ctypes.sizeof(kvt_gpu_verdict)
        verdicts = torch.zeros(n * vsize, dtype=torch.uint8, pin_memory=True)
        items = (kvt_gpu_load_item * n)()
        refs: List[Any] = []
        lp = S.init(kvt_gpu_load_params)
        if expect_fingerprint is not None:
            fp = Key(expect_fingerprint).struct
            refs.append(fp)
            lp.expect_fingerprint = ctypes.pointer(fp)
        with torch.cuda.stream(ts):
            slots_all = []
            for i in range(n):
                addr, nbytes, keep = _buffer(payloads[i], writable=False)
                given = lengths[i] if lengths else None
                ln = nbytes if given is None else int(given)
                if ln > nbytes:
                    raise ValueError(f"kvtier: length {ln} exceeds payload {i}'s {nbytes} bytes")
                slots, ntok = self._slots(block_ids[i], None)
                if i and ntok != lp.tokens:
                    raise Error(ErrorCode.ESHAPE, detail=f"kvtier: load_batch: payload {i} has "
                                f"{ntok} tokens of blocks, payload 0 {lp.tokens}: a batch's "
                                "payloads share one geometry")
                lp.tokens = ntok
                slots_all.append(slots)
                refs.append(keep)
                it = items[i]
                it.struct_size = ctypes.sizeof(kvt_gpu_load_item)
                it.payload, it.len, it.slots = addr, ln, slots.data_ptr()
                it.verdict = verdicts.data_ptr() + i * vsize
                if keys and keys[i] is not None:
                    k = Key(keys[i]).struct
                    refs.append(k)
                    it.expect_key = ctypes.pointer(k)
            loader, done = self._launch_load(ts, lib.kvt_gpu_load_batch, items, n,
                                             ctypes.byref(lp), sptr)
        return BatchTransfer(self, loader, done, [slots_all, refs, items], verdicts, n)

    def _load_batch(self, payloads: Sequence[Any], block_ids: Sequence[Any],
                    lengths: Sequence[int], keys: Optional[Sequence[Optional[KeyLike]]],
                    expect_fingerprint: Optional[KeyLike], stream: Any) -> Optional[Transfer]:
        """load_many's batched path (host payloads verified on the GPU), or
        None where the payloads do not share one geometry (nothing launched:
        the caller loads them one by one)."""
        try:
            return self.load_batch(payloads, block_ids, lengths=lengths, keys=keys,
                                   expect_fingerprint=expect_fingerprint, stream=stream)
        except Error as e:
            if e.code == ErrorCode.ESHAPE and "one geometry" in e.detail:
                return None
            raise

    def _launch_load(self, ts: Any, fn: Any, *args: Any) -> Tuple["_Handle", Any]:
        """fn(layout, *args) on a free load handle (waiting for one), then an
        event on stream ts: (the handle, the event)."""
        loader = self._loaders.get()
        try:
            self._call(loader, fn, *args)
        finally:
            self._loaders.put(loader)
        done = _torch().cuda.Event()
        done.record(ts)
        return loader, done

    def _verdict_check(self, loader: "_Handle", verdict: Any) -> Optional[Callable[[], None]]:
        """What reads a GPU-verified load's verdict once its stream passed it
        (kvt_gpu_verdict_check; raises Error), or None for other loads."""
        if verdict is None:
            return None

        def check() -> None:
            self._call(loader, lib.kvt_gpu_verdict_check, verdict.data_ptr())

        return check

    # --- through a kvtier cache --------------------------------------------------

    def store_to_cache(self, cache: Any, key: KeyLike, block_ids: Any, buf: PinnedBuffer, *,
                       prev: Optional[KeyLike] = None, fingerprint: Optional[KeyLike] = None,
                       **kw: Any) -> int:
        """Stores the blocks into buf (store()) and puts the payload into
        `cache` (a kvtier.Cache) under key, with the cache's fingerprint
        unless one is given; returns the payload's length. Other keyword
        arguments as store_async()."""
        fp = fingerprint if fingerprint is not None else cache.fingerprint
        n = self.store(block_ids, buf, key=key, fingerprint=fp, **kw)
        cache.put(key, buf.array[:n], prev)
        return n

    def load_from_cache(self, cache: Any, key: KeyLike, block_ids: Any, buf: PinnedBuffer,
                        **kw: Any) -> Optional[Transfer]:
        """Copies the payload under key from `cache` into buf and launches
        its load into block_ids (load(), expecting the key and the cache's
        fingerprint); returns the Transfer, or None on a miss. buf must not
        be reused before the Transfer is done. Raises Error as Cache.get_into
        and load()."""
        n = cache.get_into(key, buf.array)
        if n is None:
            return None
        kw.setdefault("expect_key", key)
        if cache.fingerprint is not None:
            kw.setdefault("expect_fingerprint", cache.fingerprint)
        return self.load(buf, block_ids, length=n, **kw)


__all__ = [
    "BatchTransfer", "LAYOUTS", "LOAD_STAGED", "LOAD_TRUST_DEVICE", "LOAD_TRUST_HOST",
    "LOAD_ZERO_COPY", "Layout", "MEM_DEVICE", "MEM_PAGEABLE", "MEM_PINNED", "PagedKV",
    "PinnedBuffer", "STAGING_DEFAULT", "StoreJob", "Transfer", "VLLM_LAYOUTS", "check_vllm_spec",
    "layout_of", "mem_kind", "vllm_layer_view", "vllm_layout_name",
]
