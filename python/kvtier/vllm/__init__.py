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

from .config import VLLM_VERSION, PluginConfig, Refused, check_kv_cache, chunk_key_of
from .connector import KvtierConnector, KvtierConnectorMetadata, KvtierWorkerMetadata
from .manager import KvtierLoadSpec, KvtierManager, KvtierStoreSpec
from .spec import DeviceSpec, KvtierOffloadingSpec
from .worker import KVDevice, KvtierTransferResult, KvtierWorker

__all__ = [
    "VLLM_VERSION", "DeviceSpec", "KVDevice", "KvtierConnector", "KvtierConnectorMetadata",
    "KvtierLoadSpec", "KvtierManager", "KvtierOffloadingSpec", "KvtierStoreSpec",
    "KvtierTransferResult", "KvtierWorker", "KvtierWorkerMetadata", "PluginConfig", "Refused",
    "check_kv_cache", "chunk_key_of",
]
