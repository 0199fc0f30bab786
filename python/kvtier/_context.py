"""kvt_ctx handles: one per thread for the stateless calls (a context may be
used by one thread at a time, kvtier/core.h), one per cache."""

from __future__ import annotations

import ctypes
import logging
import threading
from ctypes import c_void_p
from typing import Any, Callable

from . import _structs as S
from ._loader import lib
from .errors import Error

logger = logging.getLogger("kvtier")
_LEVELS = {S.KVT_LOG_ERROR: logging.ERROR, S.KVT_LOG_WARN: logging.WARNING,
           S.KVT_LOG_INFO: logging.INFO, S.KVT_LOG_DEBUG: logging.DEBUG}


class Context:
    """Owns one kvt_ctx. With log=True, the library's log lines go to the
    Python logger "kvtier", and the last line logged by each thread is kept as
    the detail of that thread's next error (the cache's data-path calls leave
    their detail there, not in kvt_ctx_last_error)."""

    def __init__(self, log: bool = False) -> None:
        self._handle = c_void_p()
        self._seen = threading.local()
        cfg = S.init(S.kvt_ctx_config)
        cfg.log_level = S.KVT_LOG_WARN
        self._log_fn = S.LogFn(self._on_log) if log else None
        if self._log_fn is not None:
            cfg.log = self._log_fn
        rc = lib.kvt_ctx_create(ctypes.byref(cfg), ctypes.byref(self._handle))
        if rc:
            raise Error(rc, detail="kvt_ctx_create")
        self._destroy = lib.kvt_ctx_destroy

    def _on_log(self, _opaque: Any, level: int, msg: bytes) -> None:
        text = msg.decode(errors="replace")
        self._seen.last = text
        logger.log(_LEVELS.get(level, logging.DEBUG), "%s", text)

    @property
    def handle(self) -> c_void_p:
        return self._handle

    def logged(self) -> str:
        """The last line this thread logged since clear_logged()."""
        return str(getattr(self._seen, "last", ""))

    def last_error(self) -> str:
        """kvt_ctx_last_error(), or the last line this thread logged."""
        return self.logged() or (lib.kvt_ctx_last_error(self._handle) or b"").decode(
            errors="replace")

    def clear_logged(self) -> None:
        self._seen.last = ""

    def check(self, rc: int) -> int:
        """Raises Error for a non-zero rc with this context's detail."""
        if rc:
            raise Error(rc, detail=self.last_error())
        return rc

    def call(self, fn: Callable[..., int], *args: Any) -> int:
        """fn(ctx, *args), raising Error on failure."""
        self.clear_logged()
        return self.check(fn(self._handle, *args))

    def close(self) -> None:
        if self._handle:
            self._destroy(self._handle)
            self._handle = c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_local = threading.local()


def ctx() -> Context:
    """This thread's context for the stateless calls (codec, payload, model)."""
    c = getattr(_local, "ctx", None)
    if c is None:
        c = _local.ctx = Context()
    return c
