"""kvtier: KV-cache offload for LLM serving engines, a typed ctypes binding of
libkvtier (include/kvtier.h; the 0.3 API).

    import numpy as np, kvtier
    fp = kvtier.fingerprint(kvtier.ModelDesc("my-model", layers=32, kv_heads=8,
                                             head_dim=128, dtype="fp16"), "k16v8")
    key = kvtier.chunk_key(fp, range(256))
    k = np.random.randn(32, 256, 8, 128).astype(np.float16); v = k.copy()
    payload = kvtier.encode(k, v, "k16v8", key=key, fingerprint=fp)
    k2, v2 = kvtier.decode(payload, expect_key=key, expect_fingerprint=fp)
    with kvtier.Cache("dram:1GiB", fingerprint=fp) as cache:
        cache.put(key, payload)
        assert cache.get(key) == payload

Every failed library call raises kvtier.Error(code, name, detail). The
library is found through $KVTIER_LIBRARY, the copy bundled in the package, or
the system loader (kvtier._loader). Calls release the GIL while the library works.
"""

from ._loader import VERSION as _VERSION
from ._loader import lib as _clib
from ._loader import path as library_path
from .cache import Cache, CacheStats, GetResult, Loan, Reservation, RestorePlan
from .codec import (
    PRESETS,
    Axis,
    CodecSpec,
    DType,
    Fmt,
    Scale,
    decode,
    encode,
    encode_bound,
    encode_into,
    has_feature,
)
from .errors import Error, ErrorCode, err_name, strerror
from .keys import Key, ModelDesc, chunk_key, chunk_keys, fingerprint
from .model import (
    KvRate,
    Link,
    ModelArch,
    kv_rate,
    link,
    link_presets,
    model_from_hf_config,
    model_preset,
    model_presets,
    project,
)
from .payload import Comp, PayloadInfo, SectionInfo, inspect, sections, verify

__version__ = ".".join(map(str, _VERSION))
library_version: str = _clib.kvt_version_string().decode()
"""The version of the libkvtier loaded (major.minor equal to the package's)."""

__all__ = [
    "PRESETS", "Axis", "Cache", "CacheStats", "CodecSpec", "Comp", "DType", "Error", "ErrorCode",
    "Fmt", "GetResult", "Key", "KvRate", "Link", "Loan", "ModelArch", "ModelDesc", "PayloadInfo",
    "Reservation", "RestorePlan", "Scale", "SectionInfo", "chunk_key", "chunk_keys", "decode",
    "encode", "encode_bound", "encode_into", "err_name", "fingerprint", "has_feature", "inspect",
    "kv_rate", "library_path", "library_version", "link", "link_presets", "model_from_hf_config",
    "model_preset", "model_presets", "project", "sections", "strerror", "verify",
]
