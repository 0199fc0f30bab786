#!/usr/bin/env python3
"""bench/real_kv.py - measurement only (issue 19, part 3): kvtier's GPU kernels on a
real model's K/V instead of synthetic Gaussians.

  dump  (CPU is enough) runs SmolLM2-135M (kvtier.quality's model and text) over T
        tokens of Newton's Opticks and writes, for a few layers, the post-RoPE keys,
        the values (both as the bf16 an engine's cache holds) and the post-RoPE
        queries of NQ positions spread over the context, to one .npz file.
  gpu   (a CUDA device) reads the dump and, per layer and per format:
        1. the fused store and load kernels (kvtier.gpu.PagedKV, vLLM's legacy
           layout, shuffled pages, chunks of 256 tokens, every preset): whether the
           GPU's payload is byte-for-byte the CPU codec's (kvtier.encode) and the
           loaded cache the CPU decode's, and the error of attention over the
           restored K/V;
        2. kvt_attn_decode straight from a compressed paged cache filled by
           kvt_attn_append (raw, k16v8, fp8, int4): one query per position as a
           batch of sequences sharing the pages, seq_len = position + 1;
        and the same for synthetic K/V of the same shape (bench/attn_harness.py's
        keys with outlier channels, N(0,1) values and queries), so the two sit
        side by side.
        Reference: attention in float32 (torch, on the GPU) over the exact bf16 K/V.
        Errors: relative L2 error of each (query, head) output vector,
        ||o - ref|| / ||ref||, median and 99th percentile over queries, heads and
        layers; and the median element-wise relative error, as attn_harness.py
        prints against SDPA. For kvt_attn_decode also the error against float32
        attention over the K/V its own cache holds (kvtier.decode of the same rows),
        which is the kernel's arithmetic alone.

  KVTIER_LIBRARY=build/libkvtier.so.0.3 PYTHONPATH=python \\
      ~/.cache/kvtier/venv-vllm/bin/python bench/real_kv.py dump --out build-q19/realkv.npz
  LD_LIBRARY_PATH=... KVTIER_LIBRARY=<CUDA build> PYTHONPATH=python \\
      python3 bench/real_kv.py gpu --dump build-q19/realkv.npz --json out.json
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def say(msg):
    print(msg, file=sys.stderr, flush=True)


# --- dump (CPU) ------------------------------------------------------------------


def cmd_dump(a):
    import torch
    from transformers import DynamicCache
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kvtier import quality

    if a.tokens <= 0 or a.tokens % 256:
        sys.exit("--tokens: a positive multiple of 256 (the gpu step stores chunks of 256)")
    if not 0 <= a.first_query < a.tokens:
        sys.exit("--first-query: a position below --tokens")
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model, tok, name = quality.load_model(a.model)
    say("model %s loaded in %.1f s" % (name, time.perf_counter() - t0))
    cfg = model.config.get_text_config(decoder=True)
    n_layers = cfg.num_hidden_layers
    layers = [int(x) for x in a.layers.split(",")]
    if any(not 0 <= l < n_layers for l in layers):
        sys.exit("--layers: the model has %d layers" % n_layers)
    text = a.text or quality.default_texts()[0]
    with open(text, encoding="utf-8", errors="replace") as f:
        ids = tok(f.read(), add_special_tokens=False).input_ids
    if a.skip + a.tokens > len(ids):
        sys.exit("%s has %d tokens; --skip %d + --tokens %d needs more" %
                 (text, len(ids), a.skip, a.tokens))
    ids = torch.tensor(ids[a.skip:a.skip + a.tokens])[None]
    T = a.tokens
    pos = np.unique(np.linspace(a.first_query, T - 1, a.queries).astype(np.int64))
    pos_t = torch.as_tensor(pos)
    qs, os_ = {}, {}

    def capture(module, query, key, value, attention_mask, **kw):
        # query: [1, q_heads, T, head_dim], after RoPE, as the model attends with it
        out = sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
        if module.layer_idx in layers:
            qs[module.layer_idx] = query[0, :, pos_t, :].transpose(0, 1).contiguous()
            os_[module.layer_idx] = out[0][0, pos_t].contiguous()  # [NQ, q_heads, D] float32
        return out

    ALL_ATTENTION_FUNCTIONS.register("kvtier_capture", capture)
    model.set_attn_implementation("kvtier_capture")
    cache = DynamicCache(config=model.config)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model(ids, past_key_values=cache, use_cache=True)
    say("forward of %d tokens: %.1f s" % (T, time.perf_counter() - t0))

    def bits(x):  # float32 -> bf16 bits as int16 (numpy has no bfloat16)
        return x.to(torch.bfloat16).view(torch.int16).numpy()

    ks = np.stack([bits(cache.layers[l].keys[0].transpose(0, 1)) for l in layers])
    vs = np.stack([bits(cache.layers[l].values[0].transpose(0, 1)) for l in layers])
    q = np.stack([bits(qs[l]) for l in layers])
    import transformers
    meta = dict(model=name, text=text, skip=a.skip, tokens=T, layers=layers,
                model_layers=n_layers, q_heads=cfg.num_attention_heads,
                kv_heads=cfg.num_key_value_heads, head_dim=ks.shape[-1],
                torch=torch.__version__, transformers=transformers.__version__,
                made=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    o = np.stack([os_[l].numpy() for l in layers]).astype(np.float32)
    np.savez(a.out, k=ks, v=vs, q=q, o=o, positions=pos, meta=json.dumps(meta))
    say("wrote %s: K/V %s bf16, queries %s, %.1f MB" %
        (a.out, ks.shape, q.shape, os.path.getsize(a.out) / 1e6))
    return 0


# --- gpu --------------------------------------------------------------------------


ATTN_FORMATS = [("raw", 0, "raw"), ("k16v8", 1, "k16v8"), ("fp8", 2, "fp8"),
                # the attention cache's INT4 groups keys along head_dim in 32s
                ("int4", 3, "int4,kgroup=dim,group=32")]


def ref_attention(torch, q, k, v, pos):
    """float32 attention, one query per position: q [NQ, Hq, D], k/v [T, H, D]
    (any float dtype), query i over tokens 0..pos[i]. Returns [NQ, Hq, D] fp32."""
    NQ, Hq, D = q.shape
    T, H, _ = k.shape
    G = Hq // H
    qf = q.float().view(NQ, H, G, D)
    s = torch.einsum("nhgd,thd->nhgt", qf, k.float()) / math.sqrt(D)
    mask = torch.arange(T, device=q.device)[None, :] > pos[:, None]
    s = s.masked_fill(mask[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("nhgt,thd->nhgd", p, v.float()).reshape(NQ, Hq, D)


def errors(torch, o, ref):
    o = o.float()
    rel = (o - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)  # [NQ, Hq]
    elem = ((o - ref).abs() / (ref.abs() + 1e-6)).flatten()
    return rel.flatten(), elem


def summarize(rels, elems):
    r = np.concatenate([x.cpu().numpy() for x in rels]).astype(np.float64)
    e = np.concatenate([x.cpu().numpy() for x in elems]).astype(np.float64)
    return dict(rel_l2_median=float(np.median(r)), rel_l2_p99=float(np.percentile(r, 99)),
                rel_l2_max=float(r.max()), elem_rel_median=float(np.median(e)),
                rel_l2_median_per_layer=[float(np.median(x.cpu().numpy())) for x in rels])


def per_layer(s):
    return "/".join("%.1e" % x for x in s["rel_l2_median_per_layer"])


def synth(torch, T, H, Hq, D, NQ, seed):
    sys.path.insert(0, HERE)
    from attn_harness import synth_kv
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    k, v = synth_kv(1, T, H, D, gen)  # [1, H, T, D] bf16
    q = torch.randn(NQ, Hq, D, generator=gen, device="cuda").to(torch.bfloat16)
    return k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous(), q


def store_load(torch, kvtier, K, V, codecs, chunk, gen):
    """K, V: [L, T, H, D] bf16 on the GPU. For each codec: GPU store of every chunk
    of a shuffled vLLM-legacy paged cache, compared with kvtier.encode on the CPU,
    GPU load into a second cache, compared with kvtier.decode; returns
    {codec: (restored K [L,T,H,D], restored V, dict)}."""
    from kvtier.gpu import PagedKV
    L, T, H, D = K.shape
    bs = 16
    nb = T // bs
    perm = torch.randperm(nb, generator=gen).tolist()
    perm2 = torch.randperm(nb, generator=gen).tolist()
    src = [torch.empty(2, nb, bs, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(L)]
    dst = [torch.zeros_like(s) for s in src]
    pidx = torch.tensor(perm, device="cuda")
    for l in range(L):
        src[l][0, pidx] = K[l].view(nb, bs, H, D)
        src[l][1, pidx] = V[l].view(nb, bs, H, D)
    kv_src = PagedKV(src, layout="vllm-legacy")
    kv_dst = PagedKV(dst, layout="vllm-legacy")
    Kc, Vc = K.cpu(), V.cpu()
    out = {}
    try:
        for codec in codecs:
            try:
                out[codec] = _store_load_one(torch, kvtier, kv_src, kv_dst, dst, Kc, Vc, codec,
                                             chunk, perm, perm2, L, T, H, D)
            except Exception as e:  # report and go on with the next codec
                out[codec] = e
    finally:
        kv_src.close()
        kv_dst.close()
    return out


def _store_load_one(torch, kvtier, kv_src, kv_dst, dst, Kc, Vc, codec, chunk, perm, perm2,
                    L, T, H, D):
    from kvtier.gpu import PinnedBuffer
    bs = 16
    per = chunk // bs
    buf = PinnedBuffer(kv_src.store_bound(chunk, codec))
    same_bytes = same_decode = 0
    nbytes = 0
    for c in range(T // chunk):
        blocks = perm[c * per:(c + 1) * per]
        n = kv_src.store(blocks, buf, codec=codec)
        nbytes += n
        gpu_payload = buf.array[:n].tobytes()
        cpu_payload = kvtier.encode(Kc[:, c * chunk:(c + 1) * chunk],
                                    Vc[:, c * chunk:(c + 1) * chunk], codec)
        same_bytes += gpu_payload == cpu_payload
        kv_dst.load(buf, perm2[c * per:(c + 1) * per], length=n).wait()
        dk, dv = kvtier.decode(cpu_payload)
        got_k = torch.stack([dst[l][0, perm2[c * per:(c + 1) * per]].reshape(chunk, H, D)
                             for l in range(L)]).view(torch.int16).cpu().numpy()
        got_v = torch.stack([dst[l][1, perm2[c * per:(c + 1) * per]].reshape(chunk, H, D)
                             for l in range(L)]).view(torch.int16).cpu().numpy()
        same_decode += bool((got_k == dk.view(np.int16)).all() and
                            (got_v == dv.view(np.int16)).all())
    buf.close()
    p2 = torch.tensor(perm2, device="cuda")
    rk = torch.stack([dst[l][0, p2].reshape(T, H, D) for l in range(L)])
    rv = torch.stack([dst[l][1, p2].reshape(T, H, D) for l in range(L)])
    chunks = T // chunk
    return (rk, rv, dict(chunks=chunks, payload_equal_cpu=int(same_bytes),
                         load_equal_cpu_decode=int(same_decode),
                         bytes_per_elem=nbytes / (2 * L * T * H * D)))


def attn_decode(torch, kv, fmt, K, V, q, pos, bs=16, gen=None):
    """kvt_attn_decode over a cache of format fmt filled by kvt_attn_append from
    K, V [T, H, D] (pages shuffled); one sequence per query, sharing the pages."""
    sys.path.insert(0, HERE)
    from attn_harness import DecodeParams, build_cache, stream_ptr
    L = kv.lib
    T, H, D = K.shape
    NQ, Hq, _ = q.shape
    nb = T // bs
    table_row = torch.randperm(nb, generator=gen).to(torch.int32).cuda()
    t = torch.arange(T, device="cuda")
    slots = (table_row.long()[t // bs] * bs + t % bs).contiguous()
    # the harness's cache builder takes [batch, heads, tokens, dim]: one sequence
    c, bufs, _ = build_cache(kv, fmt, 1, T, H, D, bs, K.permute(1, 0, 2)[None],
                             V.permute(1, 0, 2)[None], slots)
    table = table_row[None, :].expand(NQ, nb).contiguous()
    lens = (pos + 1).to(torch.int32).contiguous()
    out = torch.empty(NQ, Hq, D, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    p = DecodeParams(ctypes.sizeof(DecodeParams), NQ, Hq, nb, T, 1.0 / math.sqrt(D), 0, 0,
                     q.data_ptr(), table.data_ptr(), lens.data_ptr(), out.data_ptr(),
                     ws.data_ptr(), ws.numel())
    need = ctypes.c_size_t()
    kv.check(L.kvt_attn_workspace_size(kv.ctx, ctypes.byref(c), ctypes.byref(p),
                                       ctypes.byref(need)), "kvt_attn_workspace_size")
    assert need.value <= ws.numel()
    kv.check(L.kvt_attn_decode(kv.ctx, ctypes.byref(c), ctypes.byref(p), stream_ptr()),
             "kvt_attn_decode")
    torch.cuda.synchronize()
    del bufs
    return out


def cmd_gpu(a):
    import torch
    import kvtier
    sys.path.insert(0, HERE)
    from attn_harness import Kvtier

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 77
    d = np.load(a.dump)
    meta = json.loads(str(d["meta"]))
    Kall = torch.from_numpy(d["k"]).view(torch.bfloat16).cuda()  # [L, T, H, D]
    Vall = torch.from_numpy(d["v"]).view(torch.bfloat16).cuda()
    Qall = torch.from_numpy(d["q"]).view(torch.bfloat16).cuda()  # [L, NQ, Hq, D]
    pos = torch.from_numpy(d["positions"]).cuda()
    L, T, H, D = Kall.shape
    NQ, Hq = Qall.shape[1], Qall.shape[2]
    if a.chunk <= 0 or a.chunk % 16 or T % a.chunk:
        print("the dump's %d tokens are not whole chunks of --chunk %d (a multiple of 16)" %
              (T, a.chunk))
        return 2
    lib = a.lib or os.environ.get("KVTIER_LIBRARY")
    kv = Kvtier(lib)
    codecs = [c.replace(";", ",") for c in a.codecs.split(",") if c]
    gen = torch.Generator()
    gen.manual_seed(19)
    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dump=meta,
                queries=int(NQ), positions=[int(x) for x in d["positions"]], rows=[])
    print("# bench/real_kv.py gpu: %s; torch %s" % (info["device"], torch.__version__))
    print("# real K/V: %s, layers %s of %d, %d tokens of %s (from token %d), %d queries at "
          "positions %d..%d; synthetic: attn_harness.synth_kv keys (outlier channels), N(0,1) "
          "values and queries, same shape" %
          (meta["model"].split("/")[-1], meta["layers"], meta["model_layers"], T,
           meta["text"].split("/")[-1], meta["skip"], NQ, int(pos[0]), int(pos[-1])))
    print("# reference: float32 attention over the exact bf16 K/V; rel L2 = ||o - ref|| / "
          "||ref|| per (query, head); elem = median element-wise relative error")
    if "o" in d:  # the dump's check: our reference against the model's own attention
        rels = []
        for l in range(L):
            ref = ref_attention(torch, Qall[l], Kall[l], Vall[l], pos)
            rels.append(errors(torch, ref, torch.from_numpy(d["o"][l]).cuda())[0])
        r = torch.cat(rels)
        info["reference_vs_model"] = dict(rel_l2_median=r.median().item(), rel_l2_max=r.max().item())
        print("# the reference (bf16 q, K, V in float32) against the model's float32 attention "
              "output: relL2 med %.2e max %.2e (bf16 rounding of q, K, V)" %
              (r.median().item(), r.max().item()))
    datasets = [("real", Kall, Vall, Qall)]
    sk, sv, sq = [], [], []
    for l in range(L):
        k, v, q = synth(torch, T, H, Hq, D, NQ, 1000 + l)
        sk.append(k); sv.append(v); sq.append(q)
    datasets.append(("synthetic", torch.stack(sk), torch.stack(sv), torch.stack(sq)))
    hdr = ("%-9s %-12s %-26s %7s %10s %10s %10s %10s %s" %
           ("data", "path", "codec", "B/elem", "relL2 med", "relL2 p99", "relL2 max",
            "elem med", "notes"))
    print(hdr)
    for dname, K, V, Q in datasets:
        refs = [ref_attention(torch, Q[l], K[l], V[l], pos) for l in range(L)]
        # 1. the fused store / load kernels
        t0 = time.perf_counter()
        sl = store_load(torch, kvtier, K, V, codecs, a.chunk, gen)
        for codec in codecs:
            if isinstance(sl[codec], Exception):
                print("%-9s %-12s %-26s FAILED: %s" % (dname, "store+load", codec, sl[codec]))
                info["rows"].append(dict(data=dname, path="store+load", codec=codec,
                                         error=str(sl[codec])))
                continue
            rk, rv, st = sl[codec]
            rels, elems = [], []
            for l in range(L):
                o = ref_attention(torch, Q[l], rk[l], rv[l], pos)
                r, e = errors(torch, o, refs[l])
                rels.append(r); elems.append(e)
            s = summarize(rels, elems)
            s.update(st)
            note = "payload = CPU encode %d/%d, load = CPU decode %d/%d; med per layer %s" % (
                st["payload_equal_cpu"], st["chunks"], st["load_equal_cpu_decode"], st["chunks"],
                per_layer(s))
            info["rows"].append(dict(data=dname, path="store+load", codec=codec, **s))
            print("%-9s %-12s %-26s %7.3f %10.2e %10.2e %10.2e %10.2e %s" %
                  (dname, "store+load", codec, st["bytes_per_elem"], s["rel_l2_median"],
                   s["rel_l2_p99"], s["rel_l2_max"], s["elem_rel_median"], note))
            sys.stdout.flush()
        del sl
        say("%s: store/load of %d codecs in %.1f s" % (dname, len(codecs),
                                                       time.perf_counter() - t0))
        # 2. decode attention from the compressed cache
        for fname, fmt, spec in ATTN_FORMATS:
            rels, elems, orels, oelems = [], [], [], []
            for l in range(L):
                o = attn_decode(torch, kv, fmt, K[l].contiguous(), V[l].contiguous(),
                                Q[l].contiguous(), pos, gen=gen)
                r, e = errors(torch, o, refs[l])
                rels.append(r); elems.append(e)
                # float32 attention over what this cache holds: the codec's rows
                p = kvtier.encode(K[l].cpu(), V[l].cpu(), spec)
                dk, dv = kvtier.decode(p)
                hk = torch.from_numpy(dk.view(np.int16)).view(torch.bfloat16)[0].cuda()
                hv = torch.from_numpy(dv.view(np.int16)).view(torch.bfloat16)[0].cuda()
                own = ref_attention(torch, Q[l], hk, hv, pos)
                r2, e2 = errors(torch, o, own)
                orels.append(r2); oelems.append(e2)
            s = summarize(rels, elems)
            so = summarize(orels, oelems)
            bpe = (kv.lib.kvt_attn_row_bytes(fmt, D, 0) + kv.lib.kvt_attn_row_bytes(fmt, D, 1) +
                   kv.lib.kvt_attn_scale_bytes(fmt, D, 0) +
                   kv.lib.kvt_attn_scale_bytes(fmt, D, 1)) / (2 * D)
            info["rows"].append(dict(data=dname, path="attn_decode", codec=fname,
                                     bytes_per_elem=bpe, own_cache=so, **s))
            print("%-9s %-12s %-26s %7.3f %10.2e %10.2e %10.2e %10.2e vs its own cache: "
                  "relL2 med %.2e p99 %.2e; med per layer %s" %
                  (dname, "attn_decode", fname, bpe, s["rel_l2_median"], s["rel_l2_p99"],
                   s["rel_l2_max"], s["elem_rel_median"], so["rel_l2_median"],
                   so["rel_l2_p99"], per_layer(s)))
            sys.stdout.flush()
    # the scale of the inputs, to read the synthetic comparison by
    for dname, K, V, Q in datasets:
        kf = K.float()
        ch = kf.abs().amax(dim=(1,))  # [L, H, D]: max |k| per channel
        ratio = (ch.amax(-1) / ch.median(-1).values).mean().item()
        print("# %s: |k| max %.1f, per-channel max/median %.1f (mean over layers, heads); "
              "|v| max %.2f; |q| max %.1f" % (dname, kf.abs().max().item(), ratio,
                                              V.float().abs().max().item(),
                                              Q.float().abs().max().item()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(info, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="run the model on the CPU, write K/V and queries")
    d.add_argument("--out", required=True)
    d.add_argument("--model", help="as kvtier quality --model (default SmolLM2-135M)")
    d.add_argument("--text", help="default: kvtier quality's first text (Opticks)")
    d.add_argument("--tokens", type=int, default=8192)
    d.add_argument("--skip", type=int, default=512)
    d.add_argument("--layers", default="0,9,19,29")
    d.add_argument("--queries", type=int, default=64)
    d.add_argument("--first-query", type=int, default=255)
    d.add_argument("--threads", type=int, default=0)
    g = sub.add_parser("gpu", help="check the kernels on a dump")
    g.add_argument("--dump", required=True)
    g.add_argument("--lib", help="libkvtier built with CUDA (default: $KVTIER_LIBRARY)")
    g.add_argument("--codecs", default="raw,k16v8,fp8,int8,k16v4,k8v4,int4,int4;kgroup=dim",
                   help="comma-separated presets or specs (a spec's own commas as ';')")
    g.add_argument("--chunk", type=int, default=256)
    g.add_argument("--json")
    a = ap.parse_args()
    return cmd_dump(a) if a.cmd == "dump" else cmd_gpu(a)


if __name__ == "__main__":
    sys.exit(main())
