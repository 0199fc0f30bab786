"""kvtier.transformers: a transformers Cache whose past K/V live in a kvtier
cache as compressed, verified payloads (issue 19, part 1).

    from kvtier.transformers import KvtierCache
    cache = KvtierCache(model.config, "dram:2GiB", codec="k16v8", chunk_tokens=256)
    cache.track(input_ids)                       # optional: keys chain the real tokens
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

Every full chunk of chunk_tokens past tokens is encoded with the codec (all
layers in one payload, under a chained chunk key and the model's
fingerprint), put into the kvtier cache, read back and decoded: from then on
the model attends to the decoded K/V of that chunk, as an engine that offloads
and restores it would. The chunk still being filled stays exact. A chunk the
cache cannot take (full, refused) stays exact and is counted in `misses`.

Keys: with track(ids) before each forward (the ids that forward feeds), the
chunk keys chain the token ids (kvtier.chunk_keys under the fingerprint), so a
later KvtierCache over the same persistent tiers (nvme, Redis, kvtier-server)
can restore(ids) the cached prefix instead of recomputing it. Without track,
keys chain a random per-cache salt: payloads are private to this object.

One sequence per cache (batch 1); the model's cached K/V are converted to
bf16 (or fp16 for an fp16 model) for the codec and back to the model's dtype.
Needs torch and transformers (5.x); tested with transformers 5.20.2.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Optional, Tuple, Union

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from .cache import Cache as TierCache
from .codec import decode, encode
from .errors import Error
from .keys import Key, ModelDesc, chunk_key, fingerprint

log = logging.getLogger("kvtier")

__all__ = ["KvtierCache"]


class _Layer(DynamicLayer):
    """One decoder layer's past K/V, [batch 1, kv_heads, tokens, head_dim]:
    decoded full chunks, then the exact tail. The owner offloads chunks once
    the last layer has them."""

    def __init__(self, owner: "KvtierCache", index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != 1:
            raise ValueError(f"kvtier: a KvtierCache holds one sequence; got a batch of "
                             f"{key_states.shape[0]}")
        if key_states.requires_grad and torch.is_grad_enabled():
            raise ValueError("kvtier: a KvtierCache rewrites past K/V in place; run the model "
                             "under torch.no_grad() or torch.inference_mode()")
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.index == self.owner.num_layers - 1 and self.owner._due():
            # This call's tokens attend to the K/V they were computed with (as
            # in an engine, which stores a chunk once it is computed): the
            # decoded chunks go into a copy, seen from the next call on. The
            # earlier layers have attended already.
            self.keys, self.values = keys.clone(), values.clone()
            self.owner._offload_ready()
        return keys, values

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self.owner._cropped(self.get_seq_length())


class KvtierCache(Cache):
    """A transformers Cache over a kvtier cache (see the module).

    config: the model's config (num_hidden_layers, num_key_value_heads,
        head_dim or hidden_size / num_attention_heads).
    tiers: a kvtier.Cache, or a tier spec to open one ("dram:2GiB",
        "dram:1GiB;nvme:/var/cache/kvtier:100GiB"); an opened one is closed
        by close().
    codec: a kvtier codec preset or spec ("k16v8", "int4", "raw", ...).
    chunk_tokens: tokens per payload.
    model_id: the fingerprint's model name (default: config.name_or_path).
    """

    def __init__(self, config: Any, tiers: Union[str, TierCache] = "dram:1GiB", *,
                 codec: str = "k16v8", chunk_tokens: int = 256,
                 model_id: Optional[str] = None, dtype: Optional[str] = None) -> None:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") \
            else config
        self.num_layers = int(text.num_hidden_layers)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None)
                            or text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None)
                            or text.hidden_size // text.num_attention_heads)
        if chunk_tokens <= 0:
            raise ValueError(f"kvtier: chunk_tokens must be positive, not {chunk_tokens}")
        self.codec = codec
        self.chunk_tokens = int(chunk_tokens)
        if dtype not in (None, "bf16", "fp16"):
            raise ValueError(f"kvtier: dtype {dtype!r}: the codec reads bf16 or fp16")
        self.name = str(model_id or getattr(config, "name_or_path", "") or type(config).__name__)
        self.dtype = dtype  # the payloads' 16-bit type: None = the model's (fp16, else bf16)
        self.config_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        self._fingerprints: dict = {}
        self.own_tiers = isinstance(tiers, str)
        # Payloads are checked against the fingerprint at decode, so the tiers
        # need none: fp16 and bf16 runs keep apart by their keys.
        self.tiers = TierCache(tiers, chunk_tokens=self.chunk_tokens) \
            if isinstance(tiers, str) else tiers
        self.done = 0  # tokens in full chunks offloaded (all layers)
        self.keys_: List[Key] = []  # the key of each offloaded chunk
        self.ids: List[int] = []  # tokens given to track()
        self.salt = Key(os.urandom(16))
        self.hits = 0  # chunks restored from the tiers
        self.stored = 0  # chunks put
        self.misses = 0  # chunks kept exact: the tiers could not take them
        super().__init__(layers=[_Layer(self, i) for i in range(self.num_layers)])

    # --- keys ----------------------------------------------------------------------

    def track(self, input_ids: Any) -> None:
        """Records the token ids a forward is about to feed (a [1, T] tensor,
        array or list), so chunk keys chain the real tokens."""
        if len(self.ids) != self.get_seq_length():
            raise ValueError(f"kvtier: track() the ids of every forward from the first on: "
                             f"{len(self.ids)} tokens tracked, {self.get_seq_length()} cached")
        ids = np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids)
        if ids.ndim == 2:
            if ids.shape[0] != 1:
                raise ValueError("kvtier: a KvtierCache holds one sequence (batch 1)")
            ids = ids[0]
        self.ids.extend(int(t) for t in ids.reshape(-1))

    def fingerprint(self, dt: torch.dtype) -> Key:
        """The model fingerprint of payloads of 16-bit type dt."""
        fp = self._fingerprints.get(dt)
        if fp is None:
            model = ModelDesc(self.name, layers=self.num_layers, kv_heads=self.kv_heads,
                              head_dim=self.head_dim,
                              dtype="fp16" if dt == torch.float16 else "bf16")
            fp = self._fingerprints[dt] = fingerprint(model, self.codec)
        return fp

    def _key(self, chunk: int, dt: torch.dtype) -> Key:
        """The key of chunk `chunk` (chained to the one before it)."""
        prev = self.keys_[chunk - 1] if chunk else None
        c = self.chunk_tokens
        if len(self.ids) >= (chunk + 1) * c:
            return chunk_key(self.fingerprint(dt), self.ids[chunk * c:(chunk + 1) * c], prev)
        # No tokens tracked: chain this object's salt, private to it.
        return chunk_key(self.salt, np.arange(chunk * c, (chunk + 1) * c, dtype=np.uint32), prev)

    # --- offload -------------------------------------------------------------------

    def _codec_dtype(self, like: Any) -> torch.dtype:
        """The payloads' 16-bit type for K/V of dtype like."""
        if self.dtype is not None:
            return torch.float16 if self.dtype == "fp16" else torch.bfloat16
        dt = like if isinstance(like, torch.dtype) else like.dtype
        return torch.float16 if dt == torch.float16 else torch.bfloat16

    def _due(self) -> bool:
        """Whether every layer holds a full chunk beyond `done`."""
        layers: List[_Layer] = self.layers  # type: ignore[assignment]
        return min(lay.get_seq_length() for lay in layers) - self.done >= self.chunk_tokens

    def _offload_ready(self) -> None:
        """Offloads every full chunk the layers now hold beyond `done`."""
        layers: List[_Layer] = self.layers  # type: ignore[assignment]
        have = min(layer.get_seq_length() for layer in layers)
        c = self.chunk_tokens
        while have - self.done >= c:
            self._offload(self.done)
            self.done += c

    def _offload(self, start: int) -> None:
        layers: List[_Layer] = self.layers  # type: ignore[assignment]
        c = self.chunk_tokens
        chunk = start // c
        dt = self._codec_dtype(layers[0].keys)
        # [layers, tokens, heads, head_dim] in the codec's dtype, head_dim contiguous.
        k = torch.stack([lay.keys[0, :, start:start + c, :].transpose(0, 1) for lay in layers]
                        ).to(device="cpu", dtype=dt).contiguous()
        v = torch.stack([lay.values[0, :, start:start + c, :].transpose(0, 1) for lay in layers]
                        ).to(device="cpu", dtype=dt).contiguous()
        key = self._key(chunk, dt)
        self.keys_.append(key)
        payload = encode(k, v, self.codec, dtype="bf16" if dt == torch.bfloat16 else "fp16",
                         key=key, fingerprint=self.fingerprint(dt), token_begin=start)
        try:
            self.tiers.put(key, payload, prev=self.keys_[chunk - 1] if chunk else None)
            back = self.tiers.get(key)
            if back is not None:
                self._install(back, start, key, dt)
        except Error as e:
            log.warning("kvtier: chunk %d (%s) kept exact: %s", chunk, key, e)
            self.misses += 1
            return
        if back is None:  # evicted at once (a tier smaller than a chunk's neighbours)
            log.warning("kvtier: chunk %d (%s) kept exact: not held after its put", chunk, key)
            self.misses += 1
            return
        self.stored += 1

    def _install(self, payload: bytes, start: int, key: Key, dt: torch.dtype) -> None:
        """Decodes payload (checked: key, fingerprint, shape, checksums:
        raises before writing anything) into every layer's tokens
        [start, start + chunk)."""
        layers: List[_Layer] = self.layers  # type: ignore[assignment]
        c = self.chunk_tokens
        k = torch.empty((self.num_layers, c, self.kv_heads, self.head_dim), dtype=dt)
        v = torch.empty_like(k)
        decode(payload, k, v, expect_key=key, expect_fingerprint=self.fingerprint(dt))
        for i, lay in enumerate(layers):
            lay.keys[0, :, start:start + c, :] = k[i].transpose(0, 1).to(lay.keys)
            lay.values[0, :, start:start + c, :] = v[i].transpose(0, 1).to(lay.values)

    def _cropped(self, length: int) -> None:
        """A layer was cropped to length tokens: chunks past it are forgotten
        here (their payloads stay in the tiers)."""
        del self.ids[length:]  # tracked tokens past the cache are gone too
        keep = min(self.done, length // self.chunk_tokens * self.chunk_tokens)
        if keep < self.done:
            self.done = keep
            del self.keys_[keep // self.chunk_tokens:]
            # Untracked keys are positions under the salt: the refilled chunk
            # holds other tokens, so it needs other keys.
            self.salt = Key(os.urandom(16))

    # --- restore -------------------------------------------------------------------

    def restore(self, input_ids: Any, *, dtype: Optional[torch.dtype] = None,
                device: Any = "cpu") -> int:
        """For an empty cache: loads the longest cached prefix of input_ids
        (whole chunks, keys chained from the tokens; at least one token is
        left to feed) from the tiers into the layers, as tensors of dtype
        (default: the config's, else float32) on device, and tracks those
        tokens; returns how many tokens it restored. Feed the model
        input_ids[:, restored:] next. A payload that fails its checks ends
        the prefix there (it is a miss, never wrong K/V)."""
        if self.get_seq_length() or self.ids:
            raise ValueError("kvtier: restore() needs an empty KvtierCache")
        if dtype is None:
            dtype = self.config_dtype if isinstance(self.config_dtype, torch.dtype) \
                else torch.float32
        dt = self._codec_dtype(dtype)
        ids = np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids)
        ids = ids.reshape(-1)
        c = self.chunk_tokens
        usable = ids[:max(0, ids.size - 1)]  # one token is left for the model to feed
        n_chunks = self.tiers.lookup_keys(self._keys_of(usable, dt)) if usable.size >= c else 0
        if n_chunks == 0:
            return 0
        layers: List[_Layer] = self.layers  # type: ignore[assignment]
        shape = (1, self.kv_heads, n_chunks * c, self.head_dim)
        for lay in layers:
            lay.dtype, lay.device = dtype, torch.device(device)
            lay.keys = torch.zeros(shape, dtype=dtype, device=device)
            lay.values = torch.zeros(shape, dtype=dtype, device=device)
            lay.is_initialized = True
        keys = self._keys_of(ids[:n_chunks * c], dt)
        got = 0
        for i, key in enumerate(keys):
            try:
                payload = self.tiers.get(key)
                if payload is None:
                    break
                self._install(payload, i * c, key, dt)
            except Error as e:
                log.warning("kvtier: restore stops at chunk %d (%s): %s", i, key, e)
                break
            got += 1
        for lay in layers:
            lay.keys = lay.keys[..., :got * c, :].contiguous()
            lay.values = lay.values[..., :got * c, :].contiguous()
        self.keys_ = keys[:got]
        self.done = got * c
        self.ids = [int(t) for t in ids[:got * c]]
        self.hits += got
        return got * c

    def _keys_of(self, ids: np.ndarray, dt: torch.dtype) -> List[Key]:
        from .keys import chunk_keys

        return chunk_keys(self.fingerprint(dt), ids.astype(np.uint32), self.chunk_tokens)

    def reset(self) -> None:
        """Empties the cache for a new sequence (payloads stay in the tiers)."""
        super().reset()
        self.done = 0
        self.keys_ = []
        self.ids = []
        self.salt = Key(os.urandom(16))

    # --- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Closes the kvtier cache if this object opened it."""
        if self.own_tiers:
            self.tiers.close()

    def stats(self) -> dict:
        """Chunks stored, restored and kept exact, and the tiers' counters."""
        return dict(stored=self.stored, restored=self.hits, kept_exact=self.misses,
                    offloaded_tokens=self.done, tiers=self.tiers.stats())

    @property
    def is_compileable(self) -> bool:  # type: ignore[override]
        return False

    def __repr__(self) -> str:
        return (f"KvtierCache({self.name!r}, codec={self.codec!r}, "
                f"chunk_tokens={self.chunk_tokens}, offloaded={self.done} tokens)")
