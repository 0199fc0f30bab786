"""What the kvtier vLLM plug-in is configured with (kv_connector_extra_config),
what it refuses, and how a vLLM offload key becomes a kvtier chunk key.

Pinned to vLLM 0.33.0: the classes checked here are that release's
(vllm/v1/kv_cache_interface.py, vllm/v1/kv_offload/base.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from ..codec import CodecSpec
from ..errors import SHARED_TIER_SCHEMES, Refused
from ..keys import Key, ModelDesc, chunk_key, fingerprint

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

VLLM_VERSION = "0.33.0"


def _refuse(what: str, why: str) -> Refused:
    return Refused(f"kvtier.vllm: {what}: {why}")


@dataclass(frozen=True)
class PluginConfig:
    """The plug-in's keys of kv_connector_extra_config (README, section vLLM).

    tiers: kvtier tier specs, hottest first ("dram:8GiB;nvme:/var/cache/kvtier:1TiB").
        "{rank}", "{tp_size}" and "{dp_rank}" are replaced by the worker's
        rank, the tensor-parallel size and the data-parallel index: an nvme
        directory belongs to one process, so each rank needs its own.
    codec: the kvtier codec of the payloads (default k16v8).
    model_id: the model's name in the fingerprint (default vLLM's model name).
    write_through: puts also reach the persistent tiers below (default on, so
        a restarted engine finds what it stored).
    verify: gets check every section checksum on the host too.
    threads: transfer threads per worker (default 4 with the CUDA device, 8
        with a "device" factory: its threads may encode on the host). On an
        H200 4 threads beat 8 for every codec but raw stores (2.7% slower):
        bench/results/vllm_worker_h200.txt.
    device: "module:function" building the worker's KV device (default: the
        CUDA handle of kvtier.gpu); see kvtier.vllm.worker.KVDevice.
    probe_ttl_s: how long the scheduler trusts that a key is absent; default
        forever for local tiers, 1 s when a tier is shared with other engines.
    """

    tiers: str
    codec: str = "k16v8"
    model_id: Optional[str] = None
    write_through: bool = True
    verify: bool = False
    threads: Optional[int] = None
    device: Optional[str] = None
    probe_ttl_s: Optional[float] = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> "PluginConfig":
        tiers = extra.get("tiers")
        if not isinstance(tiers, str) or not tiers:
            raise _refuse("no tiers", 'kv_connector_extra_config needs "tiers", e.g. '
                          '"dram:8GiB;nvme:/var/cache/kvtier:1TiB"')
        codec = str(extra.get("codec", "k16v8"))
        CodecSpec(codec)  # raises kvtier.Error (KVT_ESPEC) for a bad spec
        given = extra.get("threads")
        threads = None if given is None else int(given)
        if threads is not None and threads < 1:
            raise _refuse("threads", f"{threads} is not a positive count")
        ttl = extra.get("probe_ttl_s")
        return cls(tiers=tiers, codec=codec, model_id=extra.get("model_id"),
                   write_through=bool(extra.get("write_through", True)),
                   verify=bool(extra.get("verify", False)), threads=threads,
                   device=extra.get("device"),
                   probe_ttl_s=None if ttl is None else float(ttl))

    @property
    def transfer_threads(self) -> int:
        """threads, or its default for the device in use."""
        if self.threads is not None:
            return self.threads
        return 8 if self.device else 4

    @property
    def shared(self) -> bool:
        """Whether a tier is written by other processes too."""
        return any(s in self.tiers for s in SHARED_TIER_SCHEMES)

    def absent_ttl(self) -> float:
        if self.probe_ttl_s is not None:
            return self.probe_ttl_s
        return 1.0 if self.shared else float("inf")

    def rank_tiers(self, rank: int, tp_size: int, world_size: int, dp_rank: int,
                   dp_size: int) -> str:
        """The tier spec of one worker, placeholders replaced."""
        spec = self.tiers
        if "nvme:" in spec and world_size > 1 and "{rank}" not in spec:
            raise _refuse("one nvme directory for several workers",
                          f"{world_size} workers each own their nvme directory; put "
                          '"{rank}" in its path, e.g. "nvme:/var/cache/kvtier/r{rank}:1TiB"')
        if "nvme:" in spec and dp_size > 1 and "{dp_rank}" not in spec:
            raise _refuse("one nvme directory for several engines",
                          f"{dp_size} data-parallel engines each own their nvme directory; "
                          'put "{dp_rank}" in its path')
        return (spec.replace("{rank}", str(rank)).replace("{tp_size}", str(tp_size))
                .replace("{dp_rank}", str(dp_rank)))


@dataclass(frozen=True)
class CacheShape:
    """One worker's share of the model's KV cache, as vLLM allocated it."""

    layers: int
    kv_heads: int  # of this rank
    head_dim: int
    dtype: str  # "bf16" or "fp16"
    block_size: int  # tokens per vLLM block
    num_blocks: int
    layer_names: tuple[str, ...]


def check_kv_cache(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig") -> CacheShape:
    """The KV cache the plug-in serves, or Refused naming what it is not:
    one group of plain full attention, bf16 or fp16, not quantized, not MLA,
    no Mamba or other hybrid groups. (kvtier's codecs take 16-bit K and V of
    equal head sizes; storing other caches raw would need a format kvtier
    does not have yet, so they are refused rather than half-served.)"""
    import torch
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec, MLAAttentionSpec,
                                            UniformTypeKVCacheSpecs)

    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype != "auto":
        raise _refuse(f"kv_cache_dtype={cache_dtype}",
                      "quantized (fp8) KV caches are not supported; kvtier's codecs "
                      "compress 16-bit K/V themselves (codec k16v8, fp8, int8, ...): "
                      "leave kv_cache_dtype at auto and pick a codec")
    groups = kv_cache_config.kv_cache_groups
    specs = [g.kv_cache_spec for g in groups]
    if any(isinstance(s, MambaSpec) for s in specs):
        raise _refuse("Mamba/hybrid model", "recurrent state groups are not supported")
    if len(groups) != 1:
        kinds = ", ".join(type(s).__name__ for s in specs)
        raise _refuse("hybrid model", f"{len(groups)} KV cache groups ({kinds}); only "
                      "models with one group of full attention are supported")
    spec = specs[0]
    if isinstance(spec, UniformTypeKVCacheSpecs):
        raise _refuse("layers of mixed cache types", type(spec).__name__)
    if isinstance(spec, MLAAttentionSpec):
        raise _refuse("MLA", "latent (MLA) caches are not supported")
    if type(spec) is not FullAttentionSpec:
        raise _refuse(type(spec).__name__, "only plain full attention is supported")
    if spec.head_size_v != spec.head_size:
        raise _refuse("head sizes", f"K head size {spec.head_size} != V {spec.head_size_v}")
    if int(spec.kv_quant_mode) != 0:
        raise _refuse("quantized KV cache", f"kv_quant_mode {spec.kv_quant_mode!r}")
    dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    if spec.dtype not in dtypes:
        raise _refuse(f"KV cache dtype {spec.dtype}", "only bf16 and fp16 caches are supported")
    policy = vllm_config.kv_transfer_config.kv_load_failure_policy
    if policy != "recompute":
        raise _refuse(f'kv_load_failure_policy "{policy}"',
                      'a missing or corrupt payload must be recomputed, not fail the request: '
                      'set "kv_load_failure_policy": "recompute" in --kv-transfer-config')
    return CacheShape(layers=len(groups[0].layer_names), kv_heads=spec.num_kv_heads,
                      head_dim=spec.head_size, dtype=dtypes[spec.dtype],
                      block_size=spec.block_size, num_blocks=kv_cache_config.num_blocks,
                      layer_names=tuple(groups[0].layer_names))


def model_fingerprint(model_id: str, shape: CacheShape, codec: str, tp_rank: int,
                      tp_size: int) -> Key:
    """The kvtier fingerprint of one rank's payloads: model, layers, this
    rank's heads, head_dim, dtype, codec, tp rank and size."""
    desc = ModelDesc(model_id, layers=shape.layers, kv_heads=shape.kv_heads,
                     head_dim=shape.head_dim, dtype=shape.dtype, tp_rank=tp_rank,
                     tp_size=tp_size)
    return fingerprint(desc, codec)


def chunk_key_of(fp: Key, offload_key: bytes, chunk_tokens: int) -> Key:
    """The kvtier key of one offloaded chunk.

    vLLM's offload key is the block hash at the chunk's end plus the KV cache
    group (vllm/v1/kv_offload/base.py make_offload_key). That hash chains every
    token before it and the request's extra keys - LoRA name and path,
    multimodal hashes, cache_salt, prompt-embeds digests - through
    hash_block_tokens() and generate_block_hash_extra_keys() in
    vllm/v1/core/kv_cache_utils.py. Its bytes go through kvt_chunk_key() as
    32-bit words with the chunk's token count, under the rank's fingerprint:
    the same prefix on the same model, rank and codec gives the same key in
    every process, and engines with other chunk sizes get other keys.
    """
    raw = bytes(offload_key) + struct.pack("<I", chunk_tokens)
    raw += b"\0" * (-len(raw) % 4)
    return chunk_key(fp, np.frombuffer(raw, dtype="<u4"))


def model_id_of(cfg: PluginConfig, vllm_model: str) -> str:
    """The model name in the fingerprint: the configured model_id, else vLLM's
    model name or path as given (set model_id where two engines name the same
    weights differently)."""
    return cfg.model_id or vllm_model
