"""A stand-in for vLLM 0.33.0's vllm/v1/kv_offload/base.py, for the GPU
machine, where vLLM cannot be installed (its wheel is too large to carry):
kvtier.vllm.worker subclasses that module's classes at import. Used by
bench/vllm_worker_bench.py and python/tests/test_vllm_cuda.py; where vLLM is
installed its real module is used instead."""

from __future__ import annotations

import enum
import importlib.machinery
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, NewType, Optional, Sequence

import numpy as np


def install_vllm_stand_in() -> bool:
    """Makes `vllm.v1.kv_offload.base` importable without vLLM (see the
    module docstring); returns whether the stand-in was installed. The
    worker-side classes are re-derived from vLLM 0.33.0's
    vllm/v1/kv_offload/base.py (Apache-2.0, Copyright contributors to the
    vLLM project)."""
    try:
        import vllm.v1.kv_offload.base  # noqa: F401
        return False
    except ImportError:
        pass
    base = types.ModuleType("vllm.v1.kv_offload.base")
    base.__doc__ = "kvtier bench stand-in for vLLM 0.33.0's vllm/v1/kv_offload/base.py"
    OffloadKey = NewType("OffloadKey", bytes)

    def make_offload_key(block_hash: bytes, group_idx: int) -> Any:
        return OffloadKey(block_hash + group_idx.to_bytes(4, "big", signed=False))

    class LoadStoreSpec:
        """Metadata of blocks to load or store."""

    class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
        def __init__(self, block_ids: List[int]) -> None:
            self.block_ids = np.array(block_ids, dtype=np.int32)

    class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
        def __init__(self, block_ids: List[int], group_sizes: Sequence[int],
                     block_indices: Sequence[int]) -> None:
            super().__init__(block_ids)
            assert sum(group_sizes) == len(block_ids)
            assert len(block_indices) == len(group_sizes)
            self.group_sizes = group_sizes
            self.block_indices = block_indices

    @dataclass
    class TransferResult:
        job_id: int
        success: bool
        transfer_size: Optional[int] = None
        transfer_time: Optional[float] = None

    class OffloadingWorker(ABC):
        @abstractmethod
        def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool: ...

        @abstractmethod
        def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any,
                        expedited: bool = False) -> bool: ...

        @abstractmethod
        def get_finished(self) -> List[Any]: ...

        @abstractmethod
        def wait(self, job_ids: set) -> None: ...

        def shutdown(self) -> None:
            return

    # Scheduler-side names kvtier.vllm.manager imports; inert here.
    class LookupResult(enum.Enum):
        MISS = enum.auto()
        HIT = enum.auto()
        HIT_PENDING = enum.auto()
        RETRY = enum.auto()

    class OffloadingManager(ABC):
        pass

    class _Placeholder:
        def __init__(self, *a: Any, **kw: Any) -> None:
            raise RuntimeError("vLLM stand-in: scheduler-side classes are not available")

    for name, obj in dict(OffloadKey=OffloadKey, make_offload_key=make_offload_key,
                          LoadStoreSpec=LoadStoreSpec,
                          BlockIDsLoadStoreSpec=BlockIDsLoadStoreSpec,
                          GPULoadStoreSpec=GPULoadStoreSpec, TransferResult=TransferResult,
                          OffloadingWorker=OffloadingWorker, LookupResult=LookupResult,
                          OffloadingManager=OffloadingManager,
                          PrepareStoreOutput=_Placeholder, ReqContext=_Placeholder,
                          RequestOffloadingContext=_Placeholder).items():
        setattr(base, name, obj)
    for pkg in ("vllm", "vllm.v1", "vllm.v1.kv_offload"):
        mod = types.ModuleType(pkg)
        mod.__path__ = []  # a package, with nothing else in it
        mod.__spec__ = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
        mod.__kvtier_stand_in__ = True  # type: ignore[attr-defined]
        sys.modules[pkg] = mod
    base.__spec__ = importlib.machinery.ModuleSpec(base.__name__, None)
    sys.modules["vllm.v1.kv_offload.base"] = base
    return True
