"""KvtierOffloadingSpec: the out-of-tree OffloadingSpec (vLLM 0.33.0,
vllm/v1/kv_offload/base.py:692) that vLLM's OffloadingConnector loads by
spec_name + spec_module_path. KvtierConnector names it for you; used under
the plain OffloadingConnector it refuses to start (see KvtierConnector)."""

from __future__ import annotations

import importlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig

from ..cache import Cache
from ..keys import Key
from .config import CacheShape, PluginConfig, Refused, model_fingerprint, model_id_of
from .manager import KvtierManager
from .worker import KVDevice, KvtierWorker

# Set by KvtierConnector while vLLM's OffloadingConnector builds the spec:
# the checked cache shape, which OffloadingConfig does not carry.
BUILDING: ContextVar[Optional[CacheShape]] = ContextVar("kvtier_vllm_building", default=None)


@dataclass(frozen=True)
class DeviceSpec:
    """What a KV device is built over (the argument of the device factory)."""

    layers: Sequence[Any]  # vLLM's per-layer KV tensors, in the group's layer order
    shape: CacheShape
    codec: str
    fingerprint: Key
    tp_rank: int
    tp_size: int
    kv_cache_layout: Optional[str]  # vLLM's resolved layout name ("LBHNC", ...)
    threads: int = 4  # the worker's transfer threads (each calls the device)


def _load_factory(path: str) -> Callable[[DeviceSpec], KVDevice]:
    module, _, name = path.partition(":")
    if not module or not name:
        raise Refused(f'kvtier.vllm: device "{path}": expected "module:function"')
    fn: Callable[[DeviceSpec], KVDevice] = getattr(importlib.import_module(module), name)
    return fn


def _cuda_device(spec: DeviceSpec) -> KVDevice:
    from .cuda import CudaDevice

    return CudaDevice(spec.layers, spec.shape, spec.codec, spec.fingerprint, spec.threads)


class KvtierOffloadingSpec(OffloadingSpec):
    """Offloads vLLM's KV cache into kvtier tiers (see the package docs)."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        shape = BUILDING.get()
        if shape is None:
            raise Refused(
                "kvtier.vllm: KvtierOffloadingSpec needs kv_connector \"KvtierConnector\" with "
                "kv_connector_module_path \"kvtier.vllm\": vLLM 0.33's OffloadingConnector "
                "asserts that every transfer succeeds (offloading/worker.py:301), so under it "
                "a missing or corrupt payload could not be recomputed")
        self.shape = shape
        self.plugin = PluginConfig.from_extra(self.extra_config)
        if len(config.groups) != 1:
            raise Refused(f"kvtier.vllm: {len(config.groups)} offloaded KV cache groups; one "
                          "group of full attention is supported")
        self.chunk_tokens = config.groups[0].tokens_per_block * self.blocks_per_chunk
        self.model_id = model_id_of(self.plugin, config.model.name)
        self._manager: Optional[KvtierManager] = None
        self._worker: Optional[KvtierWorker] = None

    def get_manager(self) -> KvtierManager:
        if self._manager is None:
            self._manager = KvtierManager(num_workers=self.config.parallel.world_size,
                                          chunk_tokens=self.chunk_tokens,
                                          absent_ttl_s=self.plugin.absent_ttl())
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        raise Refused("kvtier.vllm: the worker is built over vLLM's per-layer KV tensors "
                      "by KvtierConnector.register_kv_caches, not over canonical pages")

    def fingerprint(self) -> Key:
        p = self.config.parallel
        return model_fingerprint(self.model_id, self.shape, self.plugin.codec, p.rank, p.tp_size)

    def make_worker(self, kv_caches: Dict[str, Any]) -> KvtierWorker:
        """This rank's worker over vLLM's per-layer KV tensors (layer name ->
        tensor, as register_kv_caches receives them)."""
        if self._worker is not None:
            return self._worker
        missing = [n for n in self.shape.layer_names if n not in kv_caches]
        if missing:
            raise Refused(f"kvtier.vllm: no KV tensor for layers {missing[:4]}")
        p = self.config.parallel
        fp = self.fingerprint()
        dev_spec = DeviceSpec(layers=[kv_caches[n] for n in self.shape.layer_names],
                              shape=self.shape, codec=self.plugin.codec, fingerprint=fp,
                              tp_rank=p.rank, tp_size=p.tp_size,
                              kv_cache_layout=self.config.kv_cache_layout,
                              threads=self.plugin.transfer_threads)
        factory = _load_factory(self.plugin.device) if self.plugin.device else _cuda_device
        device = factory(dev_spec)
        tiers = self.plugin.rank_tiers(p.rank, p.tp_size, p.world_size, p.data_parallel_index,
                                       p.data_parallel_size)
        cache = Cache(tiers, fingerprint=fp, chunk_tokens=self.chunk_tokens,
                      write_through=self.plugin.write_through, verify=self.plugin.verify)
        self._worker = KvtierWorker(device, cache, fp, self.chunk_tokens, self.blocks_per_chunk,
                                    threads=self.plugin.transfer_threads)
        return self._worker
