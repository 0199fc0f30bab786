"""What kvtier's storage backends for other engines share: the options both
take (kvtier.sglang's BackendConfig, kvtier.lmcache's PluginConfig) and how
they are read from the engine's extra configuration."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .cache import Cache, Loan
from .codec import CodecSpec
from .errors import Error, ErrorCode


@dataclass(frozen=True)
class EngineOptions:
    """tiers: kvtier tier specs, hottest first (each backend says which
    placeholders it fills in). codec: the codec of the payloads (default
    k16v8). threads: encode/decode threads (default: up to 8, the cores).
    model_id: the model's name in the fingerprint (default the engine's).
    write_through: puts also reach the persistent tiers below (default on).
    verify: reads check every section checksum in the cache too (decoding
    checks them always)."""

    tiers: str
    codec: str = "k16v8"
    threads: int = 8
    model_id: Optional[str] = None
    write_through: bool = True
    verify: bool = False


def flag(v: Any) -> bool:
    """A yes/no option: a bool, a number, or "1", "true", "yes", "on" (YAML
    and JSON configurations give either)."""
    return v.lower() in ("1", "true", "yes", "on") if isinstance(v, str) else bool(v)


def options_from(extra: Mapping[str, Any], prefix: str,
                 refuse: Callable[[str, str], Exception], tiers_hint: str) -> Dict[str, Any]:
    """EngineOptions' fields from extra's keys prefix + name; refuse(what,
    why) makes the exception for missing tiers or a bad thread count
    (tiers_hint: where the tiers go, with an example); a bad codec raises
    kvtier.Error (KVT_ESPEC)."""
    tiers = extra.get(prefix + "tiers")
    if not isinstance(tiers, str) or not tiers:
        raise refuse("no tiers", tiers_hint)
    codec = str(extra.get(prefix + "codec", "k16v8"))
    CodecSpec(codec)
    threads = int(extra.get(prefix + "threads", min(8, os.cpu_count() or 1)))
    if threads < 1:
        raise refuse("threads", f"{threads} is not a positive count")
    return dict(tiers=tiers, codec=codec, threads=threads, model_id=extra.get(prefix + "model_id"),
                write_through=flag(extra.get(prefix + "write_through", True)),
                verify=flag(extra.get(prefix + "verify", False)))


def borrow_lent(cache: Cache, key: Any) -> Tuple[Optional[Loan], Optional[Error], bool]:
    """The loan of key's payload where a memory tier of cache lends it in
    place: (the loan, or None where no tier lends it here - a shared tier may
    still have it; the Error of a miss the cache reported; False where the
    cache cannot lend at all, its only tier being one that cannot)."""
    try:
        loan = cache.borrow(key)
    except Error as e:
        if e.code in (ErrorCode.ENOTSUP, -errno.EAGAIN):
            return None, None, not (e.code == ErrorCode.ENOTSUP and cache.tier_count == 1)
        return None, e, True
    if loan is not None and loan.array is None:  # not in place (device memory)
        loan.close()
        loan = None
    return loan, None, True
