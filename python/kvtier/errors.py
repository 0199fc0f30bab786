"""kvtier.Error: the one exception the binding raises for a failed C call."""

from __future__ import annotations

import enum

from ._loader import lib


class ErrorCode(enum.IntEnum):
    """The pinned KVT_E* codes of kvtier/error.h (they never change meaning)."""

    EFORMAT = -4001
    EVERSION = -4002
    ETRUNC = -4003
    ECORRUPT = -4004
    ECHECKSUM = -4005
    ETOOBIG = -4006
    EFOREIGN = -4007
    ESPEC = -4008
    ENONFINITE = -4009
    ERANGE = -4010
    ESHAPE = -4011
    ENOBUFS = -4012
    ENOTFOUND = -4013
    EBACKEND = -4014
    ECUDA = -4015
    ENOTSUP = -4016
    EAUTH = -4017
    EPROTO = -4018


def err_name(code: int) -> str:
    """kvt_err_name(code): "KVT_ECHECKSUM", "ENOMEM", "OK"; "EUNKNOWN" if unknown."""
    return str(lib.kvt_err_name(code).decode())


def strerror(code: int) -> str:
    """kvt_strerror(code): a static human-readable message."""
    return str(lib.kvt_strerror(code).decode())


class Error(Exception):
    """A kvtier call failed.

    Attributes:
        code: the C return code: a pinned KVT_E* value (compare with ErrorCode)
            or a negative errno (-errno.ENOMEM, ...).
        name: kvt_err_name(code), e.g. "KVT_ECHECKSUM" or "ENOSPC".
        detail: kvt_ctx_last_error() of the call (the field and offset, the
            layer/token/head, the tier's reason), or "" when the call left none.
    """

    code: int
    name: str
    detail: str

    def __init__(self, code: int, name: str | None = None, detail: str = "") -> None:
        self.code = int(code)
        self.name = name if name is not None else err_name(self.code)
        self.detail = detail
        super().__init__(self.code, self.name, detail)

    @property
    def message(self) -> str:
        """kvt_strerror(code)."""
        return strerror(self.code)

    def __str__(self) -> str:
        return f"{self.name}: {self.detail or self.message}"


# Refusals caused by a payload's bytes, not by the reader: an engine plug-in
# deletes such a payload, so the recomputed chunk or page is stored again.
# Other errors (KVT_ECUDA, -ENOMEM, ...) leave a good payload where it is.
PAYLOAD_FAULTS = frozenset({ErrorCode.EFORMAT, ErrorCode.EVERSION, ErrorCode.ETRUNC,
                            ErrorCode.ECORRUPT, ErrorCode.ECHECKSUM, ErrorCode.EFOREIGN,
                            ErrorCode.ESHAPE, ErrorCode.ETOOBIG})

# Tier schemes other processes write too (docs/TIERS.md, traits SHARED): a key
# an engine found absent there may appear later.
SHARED_TIER_SCHEMES = ("redis://", "redis+cluster://", "fabric://")


class Refused(ValueError):
    """An engine plug-in (kvtier.vllm, kvtier.sglang) cannot serve this model
    or configuration; the message says what and what to do instead."""

