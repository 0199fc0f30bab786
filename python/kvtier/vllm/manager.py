"""The scheduler side of the kvtier vLLM plug-in: an OffloadingManager
(vllm/v1/kv_offload/base.py:283 in vLLM 0.33.0) that knows which chunks the
workers' kvtier caches hold.

The payloads live in the workers' caches (one per rank, in the worker
processes, next to the GPU); the scheduler holds none. The manager keeps an
index of the chunks this engine stored and asks the workers about any other
key: lookup() answers RETRY, the key rides to every worker in the step's
connector metadata (KvtierConnector), each worker asks its cache - which
found the payloads of earlier runs on NVMe when it opened, and asks shared
tiers (Redis, kvtier-server) about keys it does not index - and the answers
come back with the step's output. A key is a hit once every rank holds it.
A request whose prefix holds unknown keys so waits one engine step (two
with async scheduling) before its first lookup is answered.

Nothing here protects a payload from eviction between lookup and load: the
caches evict on their own. A load that then misses, like one whose payload
is corrupt or foreign, fails; the connector reports it, vLLM recomputes the
tokens and the manager forgets the key.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)


class KvtierLoadSpec(LoadStoreSpec):
    """Chunks to load, in prefix order: the offload keys (the worker derives
    its kvtier keys from them)."""

    def __init__(self, keys: Iterable[OffloadKey]) -> None:
        self.keys: List[OffloadKey] = list(keys)

    def __repr__(self) -> str:
        return f"KvtierLoadSpec({len(self.keys)} chunks)"


class KvtierStoreSpec(LoadStoreSpec):
    """Chunks to store, in prefix order, each with the chunk before it in its
    request when the manager saw that one (None otherwise), for kvtier's
    prefix-aware eviction."""

    def __init__(self, keys: Iterable[OffloadKey], prevs: Iterable[Optional[OffloadKey]]) -> None:
        self.keys: List[OffloadKey] = list(keys)
        self.prevs: List[Optional[OffloadKey]] = list(prevs)
        assert len(self.keys) == len(self.prevs)

    def __repr__(self) -> str:
        return f"KvtierStoreSpec({len(self.keys)} chunks)"


@dataclass
class _ReqKeys:
    """Per request (ReqContext state): its keys by end token, for prevs."""

    by_end: Dict[int, OffloadKey] = field(default_factory=dict)


@dataclass
class _Probe:
    sent: float  # time.monotonic() when it left in a step's metadata
    ranks: int = 0  # ranks that answered
    held: int = 0  # ranks that hold the payload


# A probe no worker answered in this long is sent again (a step's output
# lost, a worker restarted): the request waiting on it would wait forever.
PROBE_TIMEOUT_S = 10.0


class KvtierManager(OffloadingManager):
    """OffloadingManager over the workers' kvtier caches (see the module).

    num_workers: ranks that must all hold a chunk (vLLM's world size).
    chunk_tokens: tokens per offloaded chunk (for the prev of a chunk).
    absent_ttl_s: how long a key the workers reported absent stays a miss
        without asking again (infinite for tiers no one else writes).
    max_index: keys remembered as held; the least recently used beyond it
        are forgotten (and asked about again when looked up).
    Called from the scheduler thread only: the default no-op lock serves.
    """

    def __init__(self, num_workers: int, chunk_tokens: int, absent_ttl_s: float = float("inf"),
                 max_index: int = 1 << 20) -> None:
        self.num_workers = num_workers
        self.chunk_tokens = chunk_tokens
        self.absent_ttl_s = absent_ttl_s
        self.max_index = max_index
        self._held: "OrderedDict[OffloadKey, None]" = OrderedDict()
        self._storing: Dict[OffloadKey, int] = {}
        self._failed_stores: Dict[OffloadKey, int] = {}
        self._absent: "OrderedDict[OffloadKey, float]" = OrderedDict()
        self._wanted: "OrderedDict[OffloadKey, None]" = OrderedDict()
        self._asked: Dict[OffloadKey, _Probe] = {}

    # --- bookkeeping -------------------------------------------------------

    def _remember(self, key: OffloadKey) -> None:
        self._held[key] = None
        self._held.move_to_end(key)
        self._absent.pop(key, None)
        while len(self._held) > self.max_index:
            self._held.popitem(last=False)

    def _forget(self, key: OffloadKey) -> None:
        self._held.pop(key, None)
        self._absent[key] = time.monotonic() + self.absent_ttl_s
        self._absent.move_to_end(key)
        while len(self._absent) > self.max_index:
            self._absent.popitem(last=False)

    def _note_position(self, key: OffloadKey, ctx: ReqContext) -> None:
        end = ctx.get_offload_key_position(key)
        if end is None:
            return
        keys = ctx.get_state(_ReqKeys)
        if keys is None:
            keys = _ReqKeys()
            ctx.set_state(keys)
        keys.by_end[end] = key

    def _prev(self, key: OffloadKey, ctx: ReqContext) -> Optional[OffloadKey]:
        end = ctx.get_offload_key_position(key)
        keys = ctx.get_state(_ReqKeys)
        if end is None or keys is None:
            return None
        return keys.by_end.get(end - self.chunk_tokens)

    # --- OffloadingManager ---------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._note_position(key, req_context)
        if key in self._held:
            self._held.move_to_end(key)
            return LookupResult.HIT
        if key in self._storing:
            return LookupResult.HIT_PENDING  # readable once its store completes
        expiry = self._absent.get(key)
        if expiry is not None:
            if expiry > time.monotonic():
                return LookupResult.MISS
            del self._absent[key]
        probe = self._asked.get(key)
        if probe is None or time.monotonic() - probe.sent > PROBE_TIMEOUT_S:
            self._asked.pop(key, None)
            self._wanted[key] = None
        return LookupResult.RETRY

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return KvtierLoadSpec(keys)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self._held:
                self._held.move_to_end(key)

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        for key in keys:
            self._note_position(key, req_context)
        to_store = [k for k in keys if k not in self._held and k not in self._storing]
        for key in to_store:
            self._storing[key] = 1
        prevs = [self._prev(k, req_context) for k in to_store]
        return PrepareStoreOutput(keys_to_store=to_store,
                                  store_spec=KvtierStoreSpec(to_store, prevs), evicted_keys=[])

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        for key in keys:
            self._storing.pop(key, None)
            failed = self._failed_stores.pop(key, 0)
            if success and not failed:
                self._remember(key)
            elif key not in self._held:
                self._absent.pop(key, None)  # unknown again: ask the workers next time

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def has_pending_work(self) -> bool:
        return bool(self._wanted)

    def reset_cache(self) -> None:
        """Forgets the index (the payloads stay in the tiers: they are named by
        content and model; a changed model needs another model_id)."""
        self._held.clear()
        self._absent.clear()
        self._wanted.clear()
        self._asked.clear()

    # --- the workers' reports (called by KvtierConnector) ---------------------

    def take_probes(self) -> List[OffloadKey]:
        """Keys to ask the workers about in this step's metadata."""
        keys = list(self._wanted)
        self._wanted.clear()
        now = time.monotonic()
        for key in keys:
            self._asked[key] = _Probe(sent=now)
        return keys

    def on_probe_answers(self, answered: Dict[OffloadKey, int], held: Dict[OffloadKey, int]) -> None:
        """Answers of some ranks: per key, how many answered and how many hold it."""
        for key, ranks in answered.items():
            probe = self._asked.get(key)
            if probe is None:
                continue
            probe.ranks += ranks
            probe.held += held.get(key, 0)
            if probe.ranks < self.num_workers:
                continue
            del self._asked[key]
            if probe.held >= self.num_workers:
                self._remember(key)
            elif key not in self._held and key not in self._storing:
                self._forget(key)

    def on_failed_stores(self, keys: Iterable[OffloadKey]) -> None:
        """Chunks a rank failed to store: not held, whatever complete_store says."""
        for key in keys:
            self._failed_stores[key] = 1

    def on_failed_loads(self, keys: Iterable[OffloadKey]) -> None:
        """Chunks a rank could not load (missing, corrupt, foreign): forgotten."""
        for key in keys:
            self._forget(key)
