"""The bandwidth model (kvtier/model.h): a model's KV bytes per token under a
codec, decode traffic, link shortfall; project() gives what
`kvtier project --json` prints."""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _structs as S
from ._context import ctx
from ._loader import lib
from .codec import Codec, codec_spec
from .errors import Error, ErrorCode


@dataclass(frozen=True)
class ModelArch:
    """kvt_model_arch: what the bandwidth model knows of a model. MLA models
    are kv_heads=1, k_dim = the RoPE part, v_dim = the latent (model.h)."""

    name: str
    layers: int
    kv_heads: int
    k_dim: int
    v_dim: int = 0  # 0: k_dim
    window: int = 0  # tokens a sliding-window layer reads; 0: none
    window_layers: FrozenSet[int] = field(default_factory=frozenset)
    q_heads: int = 0
    qk_dim: int = 0
    pv_dim: int = 0
    max_context: int = 0
    weight_bits: int = 0  # 0: 16
    mla: bool = False
    params: float = 0.0
    active_params: float = 0.0

    @property
    def struct(self) -> S.kvt_model_arch:
        m = S.init(S.kvt_model_arch)
        m.name = self.name.encode()[: S.KVT_ARCH_NAME_MAX - 1]
        for f in ("layers", "kv_heads", "k_dim", "v_dim", "window", "q_heads", "qk_dim",
                  "pv_dim", "max_context", "weight_bits", "params", "active_params"):
            setattr(m, f, getattr(self, f))
        m.mla = int(self.mla)
        for layer in self.window_layers:
            m.window_layers[layer // 64] |= 1 << (layer % 64)
        return m

    @classmethod
    def _from_struct(cls, m: S.kvt_model_arch) -> "ModelArch":
        wl = frozenset(i for i in range(S.KVT_ARCH_MAX_LAYERS)
                       if m.window_layers[i // 64] >> (i % 64) & 1)
        return cls(name=m.name.decode(), layers=m.layers, kv_heads=m.kv_heads, k_dim=m.k_dim,
                   v_dim=m.v_dim, window=m.window, window_layers=wl, q_heads=m.q_heads,
                   qk_dim=m.qk_dim, pv_dim=m.pv_dim, max_context=m.max_context,
                   weight_bits=m.weight_bits, mla=bool(m.mla), params=m.params,
                   active_params=m.active_params)

    def validate(self) -> None:
        """kvt_model_validate(): raises Error(KVT_ESHAPE) naming the bad field."""
        m = self.struct
        ctx().call(lib.kvt_model_validate, ctypes.byref(m))

    @property
    def weight_bytes(self) -> float:
        """Weight bytes one decode step reads (active params x bits / 8)."""
        m = self.struct
        return float(lib.kvt_model_weight_bytes(ctypes.byref(m)))


def model_preset(name: str) -> ModelArch:
    """A preset model by name (case-insensitive: "llama-3.1-8b", ...).
    Raises Error(KVT_ENOTFOUND)."""
    m = S.init(S.kvt_model_arch)
    rc = lib.kvt_model_preset(name.encode(), ctypes.byref(m))
    if rc:
        raise Error(rc, detail=f"no model preset {name!r}")
    return ModelArch._from_struct(m)


def model_presets() -> List[ModelArch]:
    """Every preset model, in the library's order."""
    out: List[ModelArch] = []
    m = S.init(S.kvt_model_arch)
    while lib.kvt_model_preset_at(len(out), ctypes.byref(m)) == 0:
        out.append(ModelArch._from_struct(m))
    return out


def model_from_hf_config(text: Union[str, bytes], name: Optional[str] = None) -> ModelArch:
    """Reads a Hugging Face config.json (its text) into a ModelArch. Raises
    Error: KVT_ECORRUPT (not JSON; offset in detail), KVT_ENOTFOUND (a
    required field missing), KVT_ERANGE / KVT_ESHAPE."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    m = S.init(S.kvt_model_arch)
    ctx().call(lib.kvt_model_from_hf_config, raw, len(raw),
               name.encode() if name is not None else None, ctypes.byref(m))
    return ModelArch._from_struct(m)


ModelLike = Union[str, "os.PathLike[str]", ModelArch]


def model_arch(model: ModelLike) -> ModelArch:
    """A ModelArch from itself, a preset name, or a config.json path (a
    name that ends in .json or holds a '/'; named after the file, as
    `kvtier project --model FILE.json` does)."""
    if isinstance(model, ModelArch):
        return model
    text = os.fspath(model)
    m = S.init(S.kvt_model_arch)
    if lib.kvt_model_preset(text.encode(), ctypes.byref(m)) == 0:
        return ModelArch._from_struct(m)
    if not text.lower().endswith(".json") and "/" not in text:
        raise Error(ErrorCode.ENOTFOUND, detail=f"unknown model {text!r} (presets: "
                                                "kvtier.model_presets(); or a config.json path)")
    base = os.path.basename(text)
    name = base[:-5] if base.lower().endswith(".json") else base
    with open(text, "rb") as f:
        data = f.read()
    return model_from_hf_config(data, None if name == "config" else name[: S.KVT_ARCH_NAME_MAX - 1])


class Link(NamedTuple):
    """A link of the bandwidth model: name, what it is, nominal GB/s (1e9 B/s)."""

    name: str
    what: str
    GBps: float


def _link(p: Any) -> Link:
    return Link(p.contents.name.decode(), p.contents.what.decode(), p.contents.GBps)


def link_presets() -> List[Link]:
    """Every preset link (HBM, NVLink, PCIe, CXL, RDMA, NVMe), in order."""
    out: List[Link] = []
    while True:
        p = lib.kvt_model_link_preset(len(out))
        if not p:
            return out
        out.append(_link(p))


def link(name: str) -> Link:
    """The preset link called name; raises Error(KVT_ENOTFOUND)."""
    p = lib.kvt_model_link_find(name.encode())
    if not p:
        raise Error(ErrorCode.ENOTFOUND, detail=f"no link preset {name!r}")
    return _link(p)


@dataclass(frozen=True)
class KvRate:
    """kvt_model_kv_rate: KV bytes per token of context, from the codec."""

    full_bytes: float  # per token, layers that read all of the context
    window_bytes: float  # per token, sliding-window layers
    window: int
    chunk_tokens: int
    elements: float

    @property
    def struct(self) -> S.kvt_model_kv_rate:
        r = S.init(S.kvt_model_kv_rate)
        r.full_bytes, r.window_bytes, r.window = self.full_bytes, self.window_bytes, self.window
        r.chunk_tokens, r.elements = self.chunk_tokens, self.elements
        return r

    def seq_bytes(self, tokens: float) -> float:
        """KV bytes of one sequence at `tokens` tokens of context."""
        r = self.struct
        return float(lib.kvt_model_seq_bytes(ctypes.byref(r), tokens))

    @property
    def bytes_per_element(self) -> float:
        r = self.struct
        return float(lib.kvt_model_bytes_per_element(ctypes.byref(r)))


def kv_rate(model: ModelLike, codec: Codec) -> KvRate:
    """kvt_model_kv_rate_get(): bytes per token of model under codec, asked of
    the codec itself (scales included). Raises Error: KVT_ESPEC, KVT_ESHAPE."""
    m = model_arch(model).struct
    spec = codec_spec(codec)
    r = S.init(S.kvt_model_kv_rate)
    ctx().call(lib.kvt_model_kv_rate_get, ctypes.byref(m), ctypes.byref(spec._c), ctypes.byref(r))
    return KvRate(r.full_bytes, r.window_bytes, r.window, r.chunk_tokens, r.elements)


def _num(v: float) -> Optional[float]:
    """As the CLI's JSON: non-finite numbers are null."""
    return v if math.isfinite(v) else None


LinkLike = Union[str, Link, Tuple[str, float]]


def _links(links: Optional[Iterable[LinkLike]]) -> List[Link]:
    if links is None:
        return link_presets()
    out = []
    for item in links:
        if isinstance(item, Link):
            out.append(item)
        elif isinstance(item, tuple):
            out.append(Link(str(item[0]), "given", float(item[-1])))
        elif "=" in item:
            name, gbps = item.split("=", 1)
            if not name or not float(gbps) > 0 or not math.isfinite(float(gbps)):
                raise ValueError(f"kvtier: link {item!r}: expected NAME=GB/s with GB/s > 0")
            out.append(Link(name, "given", float(gbps)))
        else:
            out.append(link(item))
    return out


def _models(models: Union[ModelLike, Iterable[ModelLike]]) -> List[ModelArch]:
    if isinstance(models, (str, os.PathLike, ModelArch)):
        models = [models]
    out: List[ModelArch] = []
    for m in models:
        if isinstance(m, str) and m.lower() == "all":
            out.extend(model_presets())
        else:
            out.append(model_arch(m))
    return out


def project(models: Union[ModelLike, Iterable[ModelLike]] = "llama-3.1-8b",
            codecs: Sequence[Codec] = ("raw", "k16v8", "int4"), *, batch: int = 32,
            context: float = 131072, step_ms: float = 10.0, spec_k: float = 1.0,
            links: Optional[Iterable[LinkLike]] = None, weights: bool = False,
            weight_bits: int = 0, params: Optional[float] = None) -> Dict[str, Any]:
    """Decode KV traffic per model and codec, and per link the shortfall and
    the longest context it feeds: the same numbers, in the same structure, as
    `kvtier project --json` with the same options (JSON null, for a
    non-finite number such as a max_context that any link feeds, is None).

    models: preset names, "all", config.json paths, or ModelArch values.
    codecs: specs, as given (each result's "codec" is the text given).
    batch, context (tokens), step_ms, spec_k: the load (CLI defaults).
    links: None for every preset; else preset names, "NAME=GB/s" or (name, GB/s).
    weights: add weight_bytes, kv_fraction and amdahl_bound (needs params).
    weight_bits, params: override every model's (as --weight-bits, --params).
    """
    cfg = S.init(S.kvt_model_projection_config)
    cfg.batch, cfg.context, cfg.step_ms, cfg.spec_k = float(batch), float(context), step_ms, spec_k
    arches = _models(models)
    if params is not None:
        arches = [replace(m, params=float(params), active_params=0.0) for m in arches]
    if weight_bits:
        arches = [replace(m, weight_bits=weight_bits) for m in arches]
    if weights:
        for m in arches:
            if not m.params > 0:
                raise ValueError(f"kvtier: weights=True needs the parameter count of {m.name!r}:"
                                 " give params=")
    specs = [(str(c), codec_spec(c)) for c in codecs]
    link_list = _links(links)
    raw = codec_spec("raw")
    c = ctx()
    out_models = []
    for arch in arches:
        cm = arch.struct
        raw_rate = S.init(S.kvt_model_kv_rate)
        c.call(lib.kvt_model_kv_rate_get, ctypes.byref(cm), ctypes.byref(raw._c),
               ctypes.byref(raw_rate))
        raw_seq = lib.kvt_model_seq_bytes(ctypes.byref(raw_rate), cfg.context)
        weight = lib.kvt_model_weight_bytes(ctypes.byref(cm))
        entry: Dict[str, Any] = {
            "name": arch.name, "layers": arch.layers, "kv_heads": arch.kv_heads,
            "k_dim": arch.k_dim, "v_dim": arch.v_dim or arch.k_dim, "window": arch.window,
            "mla": arch.mla, "params": _num(arch.params)}
        if weights:
            entry["weight_bytes"] = _num(weight)
        entry["codecs"] = [_project_codec(c, cm, name, spec, cfg, raw_seq, weight, link_list,
                                          weights) for name, spec in specs]
        out_models.append(entry)
    return {"batch": cfg.batch, "context": cfg.context, "step_ms": cfg.step_ms,
            "spec_k": cfg.spec_k, "models": out_models}


def _project_codec(c: Any, m: S.kvt_model_arch, name: str, spec: Any,
                   cfg: S.kvt_model_projection_config, raw_seq: float, weight: float,
                   link_list: List[Link], weights: bool) -> Dict[str, Any]:
    """One codec of one model, computed as bench/cli_project.c does."""
    rate = S.init(S.kvt_model_kv_rate)
    pr = S.kvt_model_projection()
    c.call(lib.kvt_model_kv_rate_get, ctypes.byref(m), ctypes.byref(spec._c), ctypes.byref(rate))
    c.call(lib.kvt_model_project, ctypes.byref(rate), ctypes.byref(cfg), ctypes.byref(pr))
    r = pr.seq_bytes / raw_seq
    f = pr.step_bytes / (pr.step_bytes + weight)
    f_raw = cfg.batch * raw_seq / (cfg.batch * raw_seq + weight)
    out: Dict[str, Any] = {
        "codec": name,
        "bytes_per_element": _num(lib.kvt_model_bytes_per_element(ctypes.byref(rate))),
        "full_bytes_per_token": _num(rate.full_bytes),
        "window_bytes_per_token": _num(rate.window_bytes),
        "bytes_per_token": _num(pr.bytes_per_token), "seq_bytes": _num(pr.seq_bytes),
        "step_bytes": _num(pr.step_bytes), "required_GBps": _num(pr.required_Bps / 1e9),
        "ratio_vs_raw": _num(r)}
    if weights:
        out["kv_fraction"] = _num(f)
        out["amdahl_bound"] = _num(lib.kvt_model_amdahl_bound(f_raw, r))
    rows = []
    for ln in link_list:
        tokens = ctypes.c_double(0.0)
        lib.kvt_model_max_context(c.handle, ctypes.byref(rate), ctypes.byref(cfg),
                                  ln.GBps * 1e9, ctypes.byref(tokens))
        rows.append({"link": ln.name, "GBps": _num(ln.GBps),
                     "shortfall": _num(lib.kvt_model_shortfall(pr.required_Bps, ln.GBps * 1e9)),
                     "max_context": _num(tokens.value)})
    out["links"] = rows
    return out
