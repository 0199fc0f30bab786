"""Test harness of the vLLM plug-in's tests (test_vllm*.py): vLLM's real
Scheduler on CPU, driven step by step with a worker-side connector in the same
process, over a local config.json and no weights.

The way of driving it is re-derived, against vLLM 0.33.0's classes, from
vLLM's own connector unit tests (tests/v1/kv_connector/unit/utils.py:
create_vllm_config, create_scheduler, create_request,
create_model_runner_output; and tests/v1/kv_connector/unit/
offloading_connector/utils.py: RequestRunner, whose loop runs the worker
connector between schedule() and update_from_output()). Copyright the vLLM
contributors, Apache-2.0; nothing here is copied from those files.

CpuDevice is a CPU STAND-IN FOR THE GPU HANDLE, for these tests only: it
implements kvtier.vllm.worker.KVDevice over torch CPU tensors with kvtier's
CPU codec (kvtier.encode / kvtier.decode), so the worker's logic, the
payloads and their checks are real while no GPU is involved. The GPU path is
tested on the device with kvtier.gpu.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

import kvtier
from kvtier.vllm.spec import DeviceSpec

from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.forward_context import ForwardContext
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from kvtier.vllm import KvtierConnector

EOS = 2
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16


def write_model_dir(path: Path) -> Path:
    """A tiny Llama's config.json: what ModelConfig reads; no weights."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": KV_HEADS * 2 * HEAD_DIM, "intermediate_size": 128,
        "num_hidden_layers": LAYERS, "num_attention_heads": KV_HEADS * 2,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": EOS, "tie_word_embeddings": False}))
    return path


def make_vllm_config(model_dir: Path, extra: Dict[str, Any], *, block_size: int = 16,
                     cache_dtype: str = "auto", policy: str = "recompute",
                     async_scheduling: bool = False,
                     connector: str = "KvtierConnector",
                     module_path: Optional[str] = "kvtier.vllm") -> VllmConfig:
    model = ModelConfig(model=str(model_dir), tokenizer=str(model_dir), skip_tokenizer_init=True,
                        dtype="bfloat16", seed=42, max_model_len=2048)
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048,
                            enable_chunked_prefill=True, is_encoder_decoder=False,
                            async_scheduling=async_scheduling)
    cache = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9,
                        cache_dtype=cache_dtype, enable_prefix_caching=True)
    kvt = KVTransferConfig(kv_connector=connector, kv_connector_module_path=module_path,
                           kv_role="kv_both", kv_connector_extra_config=dict(extra),
                           kv_load_failure_policy=policy)
    return VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                      kv_transfer_config=kvt, device_config=DeviceConfig("cpu"))


def full_attention_config(num_blocks: int, block_size: int = 16,
                          dtype: torch.dtype = torch.bfloat16) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                             dtype=dtype)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"layer.{i}" for i in range(LAYERS)],
                                                           spec)])


# --- the CPU stand-in for the GPU handle ---------------------------------------


class CpuDevice:
    """CPU STAND-IN FOR THE GPU HANDLE (tests only; see the module). Layer
    tensors are vLLM's [blocks, heads, block_size, 2*head_dim] views (K then
    V in the last axis), bf16."""

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.layers = [t.view(torch.int16).numpy().view(np.uint16) for t in spec.layers]
        self.block_size = spec.shape.block_size
        self.loads = 0
        self.stores = 0

    def host_buffer(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.uint8)

    def payload_bytes(self, num_blocks: int) -> int:
        sh = self.spec.shape
        return kvtier.encode_bound(self.spec.codec, sh.layers, num_blocks * self.block_size,
                                   sh.kv_heads, sh.head_dim)

    def mark(self) -> None:
        return None

    def _slots(self, block_ids: Sequence[int]) -> List[tuple]:
        return [(b, o) for b in block_ids for o in range(self.block_size)]

    def store(self, block_ids: Sequence[int], out: np.ndarray, *, key: kvtier.Key,
              after: Any) -> int:
        assert all(b >= 0 for b in block_ids)
        hd = self.spec.shape.head_dim
        rows = np.stack([np.stack([layer[b, :, o, :] for b, o in self._slots(block_ids)])
                         for layer in self.layers])  # [layers, tokens, heads, 2*hd]
        k, v = np.ascontiguousarray(rows[..., :hd]), np.ascontiguousarray(rows[..., hd:])
        self.stores += 1
        return kvtier.encode_into(out, k, v, self.spec.codec, dtype="bf16", key=key,
                                  fingerprint=self.spec.fingerprint)

    def load(self, payload: np.ndarray, block_ids: Sequence[int], *, key: kvtier.Key) -> None:
        k, v = kvtier.decode(payload, expect_key=key, expect_fingerprint=self.spec.fingerprint)
        slots = self._slots(block_ids)
        if k.shape[1] != len(slots):
            raise kvtier.Error(kvtier.ErrorCode.ESHAPE,
                               detail=f"payload of {k.shape[1]} tokens, {len(slots)} slots")
        hd = self.spec.shape.head_dim
        for li, layer in enumerate(self.layers):
            for t, (b, o) in enumerate(slots):
                if b >= 0:
                    layer[b, :, o, :hd] = k[li, t]
                    layer[b, :, o, hd:] = v[li, t]
        self.loads += 1


class BatchCpuDevice(CpuDevice):
    """The CPU stand-in with load_many, as CudaDevice has it: each chunk's
    outcome (None or its Error); `batches` counts the calls and `batched`
    the chunks they loaded."""

    def __init__(self, spec: DeviceSpec) -> None:
        super().__init__(spec)
        self.batches = 0
        self.batched = 0
        self._count_lock = threading.Lock()  # groups load on several threads

    def load_many(self, payloads: Sequence[np.ndarray], block_ids: Sequence[Sequence[int]], *,
                  keys: Sequence[kvtier.Key]) -> List[Optional[kvtier.Error]]:
        with self._count_lock:
            self.batches += 1
        out: List[Optional[kvtier.Error]] = []
        for p, ids, k in zip(payloads, block_ids, keys):
            try:
                self.load(p, ids, key=k)
                with self._count_lock:
                    self.batched += 1
                out.append(None)
            except kvtier.Error as e:
                out.append(e)
        return out


def cpu_device(spec: DeviceSpec) -> CpuDevice:
    """The "device" factory the tests name in kv_connector_extra_config."""
    return CpuDevice(spec)


# --- what the "model" writes ------------------------------------------------------


def kv_rows(token: int, pos: int, layer: int) -> np.ndarray:
    """The bf16 bits the fake model writes for one token: [heads, 2*head_dim].
    Values are small multiples of 1/8, exact in bf16 and in k16v8's K."""
    h = np.arange(KV_HEADS, dtype=np.float32)[:, None]
    d = np.arange(2 * HEAD_DIM, dtype=np.float32)[None, :]
    x = ((token * 7 + pos * 3 + layer * 5) % 61 - 30) / 8.0 + h / 4.0 - d / 16.0
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


# --- the engine loop --------------------------------------------------------------------


@dataclass
class Engine:
    """A Scheduler and a worker connector over CPU KV tensors, one step at a time."""

    scheduler: Scheduler
    worker: KvtierConnector
    layers: List[torch.Tensor]
    block_size: int
    next_id: int = 0
    computed: Dict[str, List[int]] = field(default_factory=dict)  # tokens written per request
    blocks: Dict[str, List[int]] = field(default_factory=dict)  # last block ids per request
    async_scheduling: bool = False
    pending: Any = None  # async scheduling: the step whose output is not applied yet

    @property
    def manager(self) -> Any:
        conn = self.scheduler.connector
        assert isinstance(conn, KvtierConnector)
        return conn.kvtier_manager

    @property
    def kv_worker(self) -> Any:
        return self.worker.connector_worker.worker

    def device(self) -> CpuDevice:
        dev = self.kv_worker.device
        assert isinstance(dev, CpuDevice)
        return dev

    def add(self, tokens: Sequence[int], max_tokens: int = 2) -> Request:
        params = SamplingParams(max_tokens=max_tokens)
        params.update_from_generation_config({}, EOS)
        req = Request(request_id=f"r{self.next_id}", prompt_token_ids=list(tokens),
                      sampling_params=params, pooling_params=None,
                      block_hasher=get_request_block_hasher(self.block_size, sha256))
        self.next_id += 1
        self.scheduler.add_request(req)
        return req

    def _write_kv(self, req: Request, start: int, end: int) -> None:
        (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)
        tokens = req.all_token_ids
        # With async scheduling a decode step's token is not known yet: only
        # known tokens (the prompt is what the tests check) get rows.
        for pos in range(start, min(end, len(tokens))):
            b, o = block_ids[pos // self.block_size], pos % self.block_size
            for li, layer in enumerate(self.layers):
                layer.view(torch.int16).numpy().view(np.uint16)[b, :, o, :] = kv_rows(
                    tokens[pos], pos, li)

    def step(self) -> Any:
        out = self.scheduler.schedule()
        for req_id in self.scheduler.requests:
            (ids,) = self.scheduler.kv_cache_manager.get_block_ids(req_id)
            if ids:
                self.blocks[req_id] = list(ids)
        meta = out.kv_connector_metadata
        w = self.worker
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={}))
        for req_id, n in out.num_scheduled_tokens.items():  # the "forward pass"
            req = self.scheduler.requests[req_id]
            self._write_kv(req, req.num_computed_tokens - n, req.num_computed_tokens)
            self.computed.setdefault(req_id, []).append(n)
        if out.total_num_scheduled_tokens > 0:
            w.wait_for_save()
        self.kv_worker.wait(set(self.kv_worker._jobs))  # deterministic tests: jobs done now
        results = w.get_transfer_results(out.finished_req_ids)
        kv_out = KVConnectorOutput(finished_sending=results.finished_sending,
                                   finished_recving=results.finished_recving,
                                   failed_recving=results.failed_recving,
                                   invalid_block_ids=w.get_block_ids_with_load_errors(),
                                   kv_connector_worker_meta=w.build_connector_worker_meta())
        w.clear_connector_metadata()
        req_ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=[[7] for _ in req_ids], logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=None,
                                kv_connector_output=kv_out)
        if self.async_scheduling:  # a step's output is applied after the next is scheduled
            self.flush()
            self.pending = (out, mro)
        else:
            self.scheduler.update_from_output(out, mro)
        return out

    def flush(self) -> None:
        if self.pending is not None:
            self.scheduler.update_from_output(*self.pending)
            self.pending = None

    def run(self, max_steps: int = 100) -> None:
        """Steps until no request is left and no transfer is in flight."""
        for _ in range(max_steps):
            if (not self.scheduler.has_requests()
                    and not self.scheduler.connector.has_pending_push_work()):
                if self.pending is None:
                    return
                self.flush()
                continue
            self.step()
        raise AssertionError(f"engine still busy after {max_steps} steps")

    def clear_kv(self) -> None:
        """Zeroes the KV tensors: what a load restores must come from kvtier."""
        for t in self.layers:
            t.zero_()

    def block_kv(self, req: Request, pos: int) -> np.ndarray:
        """The KV rows that the blocks req last had hold for position pos, per layer."""
        block_ids = self.blocks[req.request_id]
        b, o = block_ids[pos // self.block_size], pos % self.block_size
        return np.stack([t.view(torch.int16).numpy().view(np.uint16)[b, :, o, :]
                         for t in self.layers])

    def shutdown(self) -> None:
        self.scheduler.connector.shutdown()
        self.worker.shutdown()


def make_engine(model_dir: Path, extra: Dict[str, Any], *, num_blocks: int = 64,
                block_size: int = 16, async_scheduling: bool = False) -> Engine:
    init_none_hash(sha256)
    extra = {"device": "vllm_support:cpu_device", **extra}
    cfg = make_vllm_config(model_dir, extra, block_size=block_size,
                           async_scheduling=async_scheduling)
    kv_cfg = full_attention_config(num_blocks, block_size)
    cfg.cache_config.num_gpu_blocks = num_blocks
    scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
    scheduler = scheduler_cls(vllm_config=cfg, kv_cache_config=kv_cfg,
                          structured_output_manager=StructuredOutputManager(cfg),
                          block_size=block_size, log_stats=True)
    worker = KvtierConnector(cfg, KVConnectorRole.WORKER, kv_cfg)
    layers = [torch.zeros((num_blocks, KV_HEADS, block_size, 2 * HEAD_DIM), dtype=torch.bfloat16)
              for _ in range(LAYERS)]
    worker.register_kv_caches({f"layer.{i}": t for i, t in enumerate(layers)})
    return Engine(scheduler, worker, layers, block_size, async_scheduling=async_scheduling)


def finished(req: Request) -> bool:
    return req.status in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
