#!/usr/bin/env python3
"""bench/attn_harness.py - measurement only: kvtier's decode attention over
compressed paged caches (kvtier/attn.h, through ctypes) against every bf16
decode the machine has, in the same run: torch SDPA's flash, cuDNN and
memory-efficient backends on bf16 K/V of the same sequences gathered dense,
each called with GQA folded into the query rows and with enable_gqa=True, and
FlashInfer's paged decode (tensor-core and CUDA-core paths; a bf16 cache, and
an e4m3 cache with one scale per tensor, as FlashInfer's FP8 cache has) when
it is importable (on a machine without network: docs/ATTENTION.md, "Against
FlashInfer"). Speed-ups are against the fastest bf16 decode of each shape.
Same data, same run, CUDA events, the L2 cache flushed before every timed
iteration, medians.

  python3 bench/attn_harness.py --lib build-attn/libkvtier.so [--quick] [--iters N]

Shapes: Llama-3.1-8B attention (32 q heads, 8 kv heads, dim 128), batch x
context 32 x 8K, 8 x 32K and 8 x 128K, plus smaller ones. For every shape it
prints each baseline's time, then per kvtier format (raw = our bf16 kernel,
k16v8, fp8, int4): time, KV bytes read per second, the ratio to torch's
device-to-device copy bandwidth (read + write) measured in the same run, the
speed-up over the fastest bf16 decode, and the median relative error against
the first SDPA backend's output; a summary table at the end.
"""
import argparse
import ctypes
import math
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

RAW, K16V8, FP8, INT4 = 0, 1, 2, 3
FMT_NAMES = {RAW: "raw", K16V8: "k16v8", FP8: "fp8", INT4: "int4"}
DTYPE_BF16 = 1


class AttnCache(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("format", ctypes.c_int),
                ("dtype", ctypes.c_int), ("num_blocks", ctypes.c_uint32),
                ("block_size", ctypes.c_uint32), ("kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("k_scale", ctypes.c_void_p), ("v_scale", ctypes.c_void_p)]


class DecodeParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("batch", ctypes.c_uint32),
                ("q_heads", ctypes.c_uint32), ("max_blocks", ctypes.c_uint32),
                ("max_seq_len", ctypes.c_uint32), ("softmax_scale", ctypes.c_float),
                ("num_splits", ctypes.c_uint32), ("sm_count", ctypes.c_uint32),
                ("q", ctypes.c_void_p), ("block_table", ctypes.c_void_p),
                ("seq_lens", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("workspace", ctypes.c_void_p), ("workspace_size", ctypes.c_size_t)]


class AppendParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("batch", ctypes.c_uint32),
                ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("slots", ctypes.c_void_p)]


class Kvtier:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.kvt_ctx_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        L.kvt_ctx_last_error.argtypes = [ctypes.c_void_p]
        L.kvt_ctx_last_error.restype = ctypes.c_char_p
        L.kvt_err_name.argtypes = [ctypes.c_int]
        L.kvt_err_name.restype = ctypes.c_char_p
        L.kvt_attn_row_bytes.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_int]
        L.kvt_attn_row_bytes.restype = ctypes.c_size_t
        L.kvt_attn_scale_bytes.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_int]
        L.kvt_attn_scale_bytes.restype = ctypes.c_size_t
        L.kvt_attn_workspace_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(AttnCache),
                                              ctypes.POINTER(DecodeParams),
                                              ctypes.POINTER(ctypes.c_size_t)]
        L.kvt_attn_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(AttnCache),
                                      ctypes.POINTER(DecodeParams), ctypes.c_void_p]
        L.kvt_attn_append.argtypes = [ctypes.c_void_p, ctypes.POINTER(AttnCache),
                                      ctypes.POINTER(AppendParams), ctypes.c_void_p]
        self.ctx = ctypes.c_void_p()
        self.check(L.kvt_ctx_create(None, ctypes.byref(self.ctx)), "kvt_ctx_create")

    def check(self, rc, what):
        if rc != 0:
            detail = self.lib.kvt_ctx_last_error(self.ctx).decode() if self.ctx else ""
            raise RuntimeError("%s: %s: %s" % (what, self.lib.kvt_err_name(rc).decode(), detail))


def stream_ptr():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


class Timer:
    """Median milliseconds of fn over iters runs, L2 flushed before each."""

    def __init__(self, iters):
        self.iters = iters
        self.flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        self.e0 = torch.cuda.Event(enable_timing=True)
        self.e1 = torch.cuda.Event(enable_timing=True)

    def __call__(self, fn):
        times = []
        for i in range(self.iters + 2):
            self.flush.fill_(i & 0xFF)
            self.e0.record()
            fn()
            self.e1.record()
            self.e1.synchronize()
            if i >= 2:
                times.append(self.e0.elapsed_time(self.e1))
        return statistics.median(times)


def synth_kv(B, T, H, D, gen):
    """Keys with a few large outlier channels (gain and offset up to 20x, as
    bench/synth.c), values N(0, 1); bf16 [B, H, T, D]."""
    gain = 0.5 + torch.rand(H, D, generator=gen, device="cuda")
    offset = 0.2 * torch.randn(H, D, generator=gen, device="cuda")
    for h in range(H):
        idx = torch.randint(0, D, (4,), generator=gen, device="cuda")
        gain[h, idx] = 20.0 * (0.5 + 0.5 * torch.rand(4, generator=gen, device="cuda"))
        offset[h, idx] = 20.0 * (torch.rand(4, generator=gen, device="cuda") - 0.5)
    k = torch.randn(B, H, T, D, generator=gen, device="cuda") * gain[None, :, None, :] \
        + offset[None, :, None, :]
    v = torch.randn(B, H, T, D, generator=gen, device="cuda")
    return k.to(torch.bfloat16), v.to(torch.bfloat16)


def med_rel(o, ref):
    o = o.float().flatten()
    ref = ref.float().flatten()
    return ((o - ref).abs() / (ref.abs() + 1e-6)).median().item()


def sdpa_fns(q, kd, vd, scale):
    """Every torch SDPA backend that runs this decode on bf16 K/V, each in
    the two ways a user can call it: GQA folded into the query axis
    (q [B, H, G, D] against K/V [B, H, T, D]: each KV head's G query heads as
    G query rows, no K/V repeat) and enable_gqa=True (q [B, HQ, 1, D]).
    Returns ([(label, fn)], reason): what failed is named in reason."""
    B, HQ, D = q.shape
    H = kd.shape[1]
    G = HQ // H
    forms = [("gqa-rows", q.view(B, H, G, D), {}),
             ("enable_gqa", q.view(B, HQ, 1, D), {"enable_gqa": True})]
    out, why = [], []
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return [("sdpa-default", lambda: F.scaled_dot_product_attention(
            forms[0][1], kd, vd, scale=scale).reshape(B, HQ, D))], "no torch.nn.attention"
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for bname, backend in backends:
        for fname, qq, kw in forms:
            label = "sdpa-%s/%s" % (bname, fname)

            def run(backend=backend, qq=qq, kw=kw):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qq, kd, vd, scale=scale,
                                                          **kw).reshape(B, HQ, D)
            try:
                run()
                torch.cuda.synchronize()
                out.append((label, run))
            except (RuntimeError, TypeError) as e:
                why.append("%s: %s" % (label, str(e).splitlines()[0][:80]))
    return out, "; ".join(why)


def flashinfer_fns(q, kd, vd, table, bs, scale, ref):
    """FlashInfer's paged decode over an NHD cache of the same pages: bf16,
    and e4m3 with one scale per tensor (FlashInfer's FP8 cache has no
    per-token scales), each by its tensor-core path and (label -cc) its
    CUDA-core decode kernel. Each variant's output is also compared element
    by element with SDPA over the values its cache holds (ref for bf16; for
    e4m3, SDPA over the dequantized cache): the largest difference over the
    largest |reference|. Returns ([(label, fn, bytes, max_err)], reason): an
    empty list with the reason when flashinfer is not importable; a variant
    that fails is left out and named in the reason."""
    try:
        import flashinfer
    except ImportError:
        return [], "flashinfer not importable"
    out, why = [], []
    B, H, T, D = kd.shape
    G = q.shape[1] // H
    nb = B * T // bs
    pages = table.flatten().long()
    indptr = torch.arange(0, B + 1, dtype=torch.int32, device="cuda") * (T // bs)
    last = torch.full((B,), bs, dtype=torch.int32, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for kvt in (torch.bfloat16, torch.float8_e4m3fn):
        name = "bf16" if kvt == torch.bfloat16 else "fp8"
        try:
            cache = torch.empty(nb, 2, bs, H, D, dtype=kvt, device="cuda")
            ks = vs = None
            if kvt == torch.bfloat16:
                cache[pages, 0] = kd.permute(0, 2, 1, 3).reshape(nb, bs, H, D)
                cache[pages, 1] = vd.permute(0, 2, 1, 3).reshape(nb, bs, H, D)
                own = ref
            else:
                ks = float(kd.abs().max()) / 448.0
                vs = float(vd.abs().max()) / 448.0
                k8, v8 = (kd.float() / ks).to(kvt), (vd.float() / vs).to(kvt)
                cache[pages, 0] = k8.permute(0, 2, 1, 3).reshape(nb, bs, H, D)
                cache[pages, 1] = v8.permute(0, 2, 1, 3).reshape(nb, bs, H, D)
                kq = (k8.float() * ks).to(torch.bfloat16)
                vq = (v8.float() * vs).to(torch.bfloat16)
                del k8, v8
                own = F.scaled_dot_product_attention(q.view(B, H, G, D), kq, vq,
                                                     scale=scale).reshape(q.shape)
                del kq, vq
        except Exception as e:
            why.append("fi-%s cache failed: %s" % (name, str(e).splitlines()[0][:120]))
            continue
        for tc in (True, False):
            label = "fi-" + name + ("" if tc else "-cc")
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD",
                                                                 use_tensor_cores=tc)
                w.plan(indptr, table.flatten(), last, q.shape[1], H, D, bs, sm_scale=scale,
                       q_data_type=torch.bfloat16, kv_data_type=kvt)
                if ks is None:
                    fn = (lambda w=w, cache=cache: w.run(q, cache))
                else:
                    fn = (lambda w=w, cache=cache, ks=ks, vs=vs:
                          w.run(q, cache, k_scale=ks, v_scale=vs))
                o = fn().reshape(own.shape).float()
                torch.cuda.synchronize()
                max_err = ((o - own.float()).abs().max() / own.float().abs().max()).item()
                out.append((label, fn, cache.numel() * cache.element_size(), max_err))
            except Exception as e:  # any API difference: report and go on
                why.append("%s failed: %s" % (label, str(e).splitlines()[0][:120]))
        del own
    return out, "; ".join(why)


def build_cache(kv, fmt, B, T, H, D, bs, kd, vd, slots):
    L = kv.lib
    nb = B * T // bs
    rows = nb * bs * H
    bufs = {}
    c = AttnCache(ctypes.sizeof(AttnCache), fmt, DTYPE_BF16, nb, bs, H, D)
    for name, isv in (("k", 0), ("v", 1)):
        bufs[name] = torch.empty(rows * L.kvt_attn_row_bytes(fmt, D, isv), dtype=torch.uint8,
                                 device="cuda")
        setattr(c, name, bufs[name].data_ptr())
        sb = L.kvt_attn_scale_bytes(fmt, D, isv)
        if sb:
            bufs[name + "s"] = torch.empty(rows * sb, dtype=torch.uint8, device="cuda")
            setattr(c, name + "_scale", bufs[name + "s"].data_ptr())
    # tokens in (sequence, position) order, [N, H, D]
    chunk = 1 << 16
    ktok = kd.permute(0, 2, 1, 3).reshape(B * T, H, D)
    vtok = vd.permute(0, 2, 1, 3).reshape(B * T, H, D)
    for s0 in range(0, B * T, chunk):
        kc = ktok[s0:s0 + chunk].contiguous()
        vc = vtok[s0:s0 + chunk].contiguous()
        sc = slots[s0:s0 + chunk].contiguous()
        a = AppendParams(ctypes.sizeof(AppendParams), kc.shape[0], kc.data_ptr(),
                         vc.data_ptr(), sc.data_ptr())
        kv.check(L.kvt_attn_append(kv.ctx, ctypes.byref(c), ctypes.byref(a), stream_ptr()),
                 "kvt_attn_append")
    torch.cuda.synchronize()
    bytes_read = B * T * H * (L.kvt_attn_row_bytes(fmt, D, 0) + L.kvt_attn_row_bytes(fmt, D, 1)
                              + L.kvt_attn_scale_bytes(fmt, D, 0)
                              + L.kvt_attn_scale_bytes(fmt, D, 1))
    return c, bufs, bytes_read


def run_shape(kv, timer, B, T, copy_bw, args):
    HQ, H, D, bs = 32, 8, 128, args.block_size
    G = HQ // H
    scale = 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1000 + B * 7 + T)
    kd, vd = synth_kv(B, T, H, D, gen)
    q = torch.randn(B, HQ, D, generator=gen, device="cuda").to(torch.bfloat16)
    mb = T // bs
    perm = torch.randperm(B * mb, generator=gen, device="cuda").to(torch.int32)
    table = perm.view(B, mb).contiguous()
    lens = torch.full((B,), T, dtype=torch.int32, device="cuda")
    pos = torch.arange(T, device="cuda")
    slots = (table.long()[:, pos // bs] * bs + (pos % bs)[None, :]).reshape(-1).contiguous()

    sdpas, why_s = sdpa_fns(q, kd, vd, scale)
    if not sdpas:
        raise RuntimeError("no torch SDPA backend runs this shape: " + why_s)
    ref = sdpas[0][1]()  # the first backend that runs (flash): the reference for errors
    ref_label = sdpas[0][0]
    kv_bf16 = 2 * B * T * H * D * 2
    base = []  # (label, ms): every bf16 decode of this run; the fastest is the baseline
    for label, fn in sdpas:
        err = med_rel(fn(), ref)
        t = timer(fn)
        base.append((label, t))
        print("%3d x %6d  %-24s %9.1f us  %8.1f GB/s  %5.2f of copy  median rel err vs %s %.4f"
              % (B, T, label, t * 1e3, kv_bf16 / t / 1e6, kv_bf16 / t / 1e6 / copy_bw,
                 ref_label, err))
        sys.stdout.flush()
    if why_s:
        print("            (%s)" % why_s)
    fis, why = flashinfer_fns(q, kd, vd, table, bs, scale, ref)
    fi_rows = []
    fn = None
    for label, fn, nbytes, max_err in fis:
        err = med_rel(fn().reshape(B, HQ, D), ref)
        t_fi = timer(fn)
        if label.startswith("fi-bf16"):
            base.append((label, t_fi))
        fi_rows.append((label, t_fi, nbytes, err, max_err))
        sys.stdout.flush()
    del fis, fn
    best_label, t_best = min(base, key=lambda x: x[1])
    for label, t_fi, nbytes, err, max_err in fi_rows:
        print("%3d x %6d  %-24s %9.1f us  %8.1f GB/s  %5.2f of copy  %5.2fx fastest  "
              "median rel err vs %s %.4f  max err vs its own cache %.4f%s" %
              (B, T, label, t_fi * 1e3, nbytes / t_fi / 1e6, nbytes / t_fi / 1e6 / copy_bw,
               t_best / t_fi, ref_label, err, max_err,
               "  (OVER 0.02: check)" if max_err > 0.02 else ""))
    if why:
        print("            (%s)" % why)
    print("%3d x %6d  fastest bf16 decode of this run: %s, %.1f us (%.2f of copy)" %
          (B, T, best_label, t_best * 1e3, kv_bf16 / t_best / 1e6 / copy_bw))
    out = torch.empty(B, HQ, D, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for fmt in (RAW, K16V8, FP8, INT4):
        try:
            c, bufs, nbytes = build_cache(kv, fmt, B, T, H, D, bs, kd, vd, slots)
            p = DecodeParams(ctypes.sizeof(DecodeParams), B, HQ, mb, T, scale, 0, 0,
                             q.data_ptr(), table.data_ptr(), lens.data_ptr(), out.data_ptr(),
                             ws.data_ptr(), ws.numel())
            need = ctypes.c_size_t()
            kv.check(kv.lib.kvt_attn_workspace_size(kv.ctx, ctypes.byref(c), ctypes.byref(p),
                                                    ctypes.byref(need)), "workspace size")
            assert need.value <= ws.numel()

            def ours(c=c, p=p):
                kv.check(kv.lib.kvt_attn_decode(kv.ctx, ctypes.byref(c), ctypes.byref(p),
                                                stream_ptr()), "kvt_attn_decode")
            ours()
            torch.cuda.synchronize()
            err = med_rel(out, ref)
            t = timer(ours)
            rows.append((FMT_NAMES[fmt], t, nbytes, err, t_best / t))
            print("%3d x %6d  %-24s %9.1f us  %8.1f GB/s  %5.2f of copy  %5.2fx fastest  "
                  "median rel err vs %s %.4f" %
                  (B, T, "kvtier-" + FMT_NAMES[fmt], t * 1e3, nbytes / t / 1e6,
                   nbytes / t / 1e6 / copy_bw, t_best / t, ref_label, err))
            del bufs
        except Exception as e:  # report and go on with the next format
            print("%3d x %6d  %-24s FAILED: %s" % (B, T, "kvtier-" + FMT_NAMES[fmt], e))
        sys.stdout.flush()
    del kd, vd
    torch.cuda.empty_cache()
    return best_label, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="path to libkvtier.so (built with CUDA)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="only 32 x 8K, 8 x 32K and 8 x 128K")
    ap.add_argument("--shape", help="only B x T, e.g. 8x131072")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    # a backend that cannot run a call says why in a UserWarning, then raises:
    # the reason is printed once per shape (sdpa_fns), the warnings are noise
    warnings.filterwarnings("ignore", category=UserWarning, module=__name__)
    kv = Kvtier(args.lib)
    timer = Timer(args.iters)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = timer(lambda: dst.copy_(src))
    copy_bw = 2 * src.numel() / t_copy / 1e6  # GB/s, read + write
    del src, dst
    print("device: %s; torch %s; D2D copy of 1 GiB: %.1f GB/s (read + write)" %
          (torch.cuda.get_device_name(), torch.__version__, copy_bw))
    print("Llama-3.1-8B attention: 32 q heads, 8 kv heads, dim 128, bf16, block %d; "
          "medians of %d, L2 flushed" % (args.block_size, args.iters))
    shapes = [(32, 8192), (8, 32768), (8, 131072)]
    if not args.quick:
        shapes += [(1, 32768), (4, 4096), (64, 2048), (16, 1024)]
    if args.shape:
        try:
            B, T = (int(x) for x in args.shape.lower().split("x"))
        except ValueError:
            ap.error("--shape: B x T, e.g. 8x131072")
        if B < 1 or T < args.block_size or T % args.block_size:
            ap.error("--shape: B >= 1 and T a multiple of the block size")
        shapes = [(B, T)]
    summary = []
    for B, T in shapes:
        summary.append((B, T, run_shape(kv, timer, B, T, copy_bw, args)))
    print("\nsummary: speed-up of each kvtier format over the fastest bf16 decode of the same "
          "shape and run (its label), and bytes read / D2D copy bandwidth")
    for B, T, (best_label, rows) in summary:
        print("%3d x %6d  vs %-24s %s" % (B, T, best_label, "  ".join(
            "%s %.2fx (%.2f of copy)" % (name, speedup, nbytes / t / 1e6 / copy_bw)
            for name, t, nbytes, err, speedup in rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
