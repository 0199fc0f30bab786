"""KvtierConnector: vLLM 0.33.0's OffloadingConnector with what the spec
route cannot express, loaded through kv_connector_module_path.

vLLM's OffloadingConnector (distributed/kv_transfer/kv_connector/v1/
offloading_connector.py) drives any OffloadingSpec, and kvtier's is
KvtierOffloadingSpec. Three things need the connector itself:

- Failed transfers. Its worker side asserts that every TransferResult
  succeeded (offloading/worker.py:301) and has no get_block_ids_with_load_errors.
  Here a failed async load is reported in failed_recving (and finished_recving),
  a failed sync load by its blocks in get_block_ids_with_load_errors(), so the
  scheduler recomputes them (kv_load_failure_policy "recompute",
  v1/core/sched/scheduler.py _handle_failed_recving/_handle_invalid_blocks);
  the failed chunks also reach the manager, which forgets them, and a failed
  store never becomes a hit.
- Lookups of keys the scheduler did not see stored (an earlier run's NVMe
  payloads, another engine's on a shared tier): the manager's probes ride in
  the step's connector metadata and the workers' answers in their metadata.
- The worker is built over vLLM's per-layer KV tensors (kvtier's kernels read
  the paged layout itself), not over the connector's canonical byte pages.

It also refuses, at construction, caches and configurations the plug-in does
not serve (kvtier.vllm.config.check_kv_cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Set, Tuple

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.outputs import KVConnectorOutput

from .config import Refused, check_kv_cache
from .manager import KvtierManager
from .spec import BUILDING, KvtierOffloadingSpec
from .worker import KvtierTransferResult, KvtierWorker

SPEC_NAME = "KvtierOffloadingSpec"
SPEC_MODULE = "kvtier.vllm.spec"


@dataclass
class KvtierConnectorMetadata(OffloadingConnectorMetadata):
    """The step's transfer jobs, and the keys every worker is asked about."""

    probes: List[OffloadKey] = field(default_factory=list)


@dataclass
class KvtierWorkerMetadata(OffloadingWorkerMetadata):
    """Completed jobs, probe answers and failed chunks of one or more workers
    (summed over workers by aggregate())."""

    probe_answered: Dict[OffloadKey, int] = field(default_factory=dict)
    probe_held: Dict[OffloadKey, int] = field(default_factory=dict)
    failed_store_keys: Set[OffloadKey] = field(default_factory=set)
    failed_load_keys: Set[OffloadKey] = field(default_factory=set)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        base = super().aggregate(other)
        assert isinstance(base, OffloadingWorkerMetadata)
        out = KvtierWorkerMetadata(completed_jobs=base.completed_jobs,
                                   transfer_stats=base.transfer_stats)
        for meta in (self, other):
            if not isinstance(meta, KvtierWorkerMetadata):
                continue
            for key, n in meta.probe_answered.items():
                out.probe_answered[key] = out.probe_answered.get(key, 0) + n
            for key, n in meta.probe_held.items():
                out.probe_held[key] = out.probe_held.get(key, 0) + n
            out.failed_store_keys |= meta.failed_store_keys
            out.failed_load_keys |= meta.failed_load_keys
        return out


class KvtierConnectorWorker(OffloadingConnectorWorker):
    """The worker side: jobs as OffloadingConnectorWorker submits them, with
    failures reported instead of asserted away, and probes answered."""

    spec: KvtierOffloadingSpec

    def __init__(self, spec: KvtierOffloadingSpec, vllm_config: VllmConfig,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(spec, vllm_config, kv_cache_config)
        self._failed_recving: Set[str] = set()
        self._invalid_block_ids: Set[int] = set()
        self._answered: Dict[OffloadKey, int] = {}
        self._held: Dict[OffloadKey, int] = {}
        self._failed_store_keys: Set[OffloadKey] = set()
        self._failed_load_keys: Set[OffloadKey] = set()

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self.worker = self.spec.make_worker(kv_caches)

    def start_kv_transfers(self, metadata: OffloadingConnectorMetadata) -> None:
        if isinstance(metadata, KvtierConnectorMetadata) and metadata.probes:
            assert isinstance(self.worker, KvtierWorker)
            held = self.worker.probe(metadata.probes)
            for key in metadata.probes:
                self._answered[key] = 1
                if key in held:
                    self._held[key] = 1
        super().start_kv_transfers(metadata)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Set[str], Set[str]]:
        """As OffloadingConnectorWorker.get_finished, failures included: every
        job is reported completed; a failed load's request is also in
        failed_recving (async) or its blocks invalid (sync)."""
        assert self.worker is not None
        finished_recving: Set[str] = set()
        for result in self.worker.get_finished():
            job_id = result.job_id
            is_load = job_id in self._load_jobs
            if result.transfer_time is not None and result.transfer_size is not None:
                stats = self._connector_worker_meta.transfer_stats
                (stats.load if is_load else stats.store).record(result.transfer_size,
                                                                result.transfer_time)
            self._connector_worker_meta.mark_completed(job_id)
            req_id = self._load_jobs.pop(job_id, None)
            if req_id is not None:
                finished_recving.add(req_id)
            if result.success:
                continue
            failed = result.failed_keys if isinstance(result, KvtierTransferResult) else []
            if not is_load:
                self._failed_store_keys.update(failed)
                continue
            self._failed_load_keys.update(failed)
            if req_id is not None:
                self._failed_recving.add(req_id)
            elif isinstance(result, KvtierTransferResult):
                self._invalid_block_ids.update(result.invalid_block_ids)
        return set(), finished_recving

    def take_failed_recving(self) -> Set[str]:
        out, self._failed_recving = self._failed_recving, set()
        return out

    def take_invalid_block_ids(self) -> Set[int]:
        out, self._invalid_block_ids = self._invalid_block_ids, set()
        return out

    def build_connector_worker_meta(self) -> Optional[OffloadingWorkerMetadata]:
        base = super().build_connector_worker_meta()
        if not (base or self._answered or self._failed_store_keys or self._failed_load_keys):
            return None
        meta = KvtierWorkerMetadata(
            completed_jobs=base.completed_jobs if base else {},
            transfer_stats=base.transfer_stats if base else KvtierWorkerMetadata().transfer_stats,
            probe_answered=self._answered, probe_held=self._held,
            failed_store_keys=self._failed_store_keys, failed_load_keys=self._failed_load_keys)
        self._answered, self._held = {}, {}
        self._failed_store_keys, self._failed_load_keys = set(), set()
        return meta


class KvtierConnector(OffloadingConnector):
    """vLLM's OffloadingConnector over KvtierOffloadingSpec (see the module).

    --kv-transfer-config '{"kv_connector": "KvtierConnector",
      "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"tiers": "dram:8GiB;nvme:/var/cache/kvtier:1TiB"}}'
    """

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        kvt = vllm_config.kv_transfer_config
        assert kvt is not None
        extra = kvt.kv_connector_extra_config
        given = extra.get("spec_name", SPEC_NAME), extra.get("spec_module_path", SPEC_MODULE)
        if given != (SPEC_NAME, SPEC_MODULE):
            raise Refused(f"kvtier.vllm: KvtierConnector drives {SPEC_NAME} only, "
                          f"not spec {given[0]!r} from {given[1]!r}")
        extra["spec_name"], extra["spec_module_path"] = SPEC_NAME, SPEC_MODULE
        par = vllm_config.parallel_config
        others = {"pipeline": par.pipeline_parallel_size,
                  "decode context": par.decode_context_parallel_size,
                  "prefill context": par.prefill_context_parallel_size}
        for what, size in others.items():
            if size != 1:
                raise Refused(f"kvtier.vllm: {what} parallelism ({size}): only tensor "
                              "parallelism is supported (one payload per rank)")
        shape = check_kv_cache(vllm_config, kv_cache_config)
        token = BUILDING.set(shape)
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        finally:
            BUILDING.reset(token)
        if self.connector_worker is not None:
            spec = self.connector_worker.spec
            assert isinstance(spec, KvtierOffloadingSpec)
            self.connector_worker = KvtierConnectorWorker(spec, vllm_config, kv_cache_config)

    @property
    def kvtier_manager(self) -> KvtierManager:
        manager = self.scheduler.manager
        assert isinstance(manager, KvtierManager)
        return manager

    # --- scheduler side ------------------------------------------------------

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)
        assert isinstance(meta, OffloadingConnectorMetadata)
        manager = self.kvtier_manager
        with manager.lock:
            probes = manager.take_probes()
        return KvtierConnectorMetadata(**{f.name: getattr(meta, f.name) for f in fields(meta)},
                                       probes=probes)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KvtierWorkerMetadata):
            manager = self.kvtier_manager
            with manager.lock:
                manager.on_failed_stores(meta.failed_store_keys)
                manager.on_failed_loads(meta.failed_load_keys)
                manager.on_probe_answers(meta.probe_answered, meta.probe_held)
        super().update_connector_output(connector_output)

    # --- worker side ---------------------------------------------------------

    def _kvtier_worker(self) -> KvtierConnectorWorker:
        assert isinstance(self.connector_worker, KvtierConnectorWorker)
        return self.connector_worker

    def get_transfer_results(self, finished_req_ids: Set[str]) -> KVConnectorTransferResults:
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(
            finished_sending=set(sending or ()), finished_recving=set(recving or ()),
            failed_recving=self._kvtier_worker().take_failed_recving())

    def get_block_ids_with_load_errors(self) -> Set[int]:
        return self._kvtier_worker().take_invalid_block_ids()
