"""kvtier.vllm: vLLM's KV offload into kvtier tiers (DRAM, NVMe, Redis,
kvtier-server), compressed by kvtier's codecs. Written against vLLM 0.33.0.

Turn it on with one flag (README, section vLLM):

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
      "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"tiers": "dram:8GiB;nvme:/var/cache/kvtier:1TiB",
                                    "codec": "k16v8"}}'

KvtierConnector (connector.py) is vLLM's OffloadingConnector over
KvtierOffloadingSpec (spec.py): KvtierManager (manager.py) on the scheduler,
KvtierWorker (worker.py) on each rank, each rank with its own kvtier cache
and payloads under its own fingerprint (config.py).
"""

from typing import Any

# The names below are imported on first use (PEP 562): vLLM is needed only by
# the ones that subclass its classes, so kvtier.vllm.cuda (the CUDA device)
# and kvtier.vllm.config import without it.
_WHERE = {
    "VLLM_VERSION": "config", "PluginConfig": "config", "Refused": "config",
    "check_kv_cache": "config", "chunk_key_of": "config",
    "KvtierConnector": "connector", "KvtierConnectorMetadata": "connector",
    "KvtierWorkerMetadata": "connector",
    "KvtierLoadSpec": "manager", "KvtierManager": "manager", "KvtierStoreSpec": "manager",
    "DeviceSpec": "spec", "KvtierOffloadingSpec": "spec",
    "KVDevice": "worker", "KvtierTransferResult": "worker", "KvtierWorker": "worker",
    "CudaDevice": "cuda",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtier.vllm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
