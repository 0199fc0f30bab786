"""kvtier.gpu without a GPU: the module imports without torch, the layouts it
derives from shapes and strides equal the C fillers' descriptors and address
every K/V element where vLLM 0.33 puts it, vLLM specs kvtier cannot store are
refused with their reason, and the ctypes mirrors of kvtier/gpu.h's structs
match the C compiler. The device tests are in test_gpu_torch.py."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List

import numpy as np
import pytest
import vllm_layout

import kvtier
import kvtier.gpu as kg
from kvtier import ErrorCode
from kvtier._loader import lib

REPO = Path(__file__).resolve().parents[2]
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def c_desc_v1(layers: int, blocks: int, bs: int, heads: int, dim: int,
              layout: str) -> kg.kvt_gpu_layout_desc:
    d = kg.kvt_gpu_layout_desc()
    ptrs = (ctypes.c_void_p * layers)(*([16] * layers))
    lib.kvt_gpu_layout_desc_vllm_v1(ctypes.byref(d), 1, layers, ptrs, blocks, bs, heads, dim,
                                    kg.VLLM_LAYOUTS.index(layout))
    return d


def test_import_needs_no_torch_and_a_handle_says_it_does() -> None:
    assert kg.STAGING_DEFAULT == 64 << 20
    if HAVE_TORCH:
        pytest.skip("torch is installed: the missing-torch message cannot be shown")
    with pytest.raises(ImportError, match="install torch"):
        kg.PagedKV([object()])


@pytest.mark.parametrize("layout", kg.VLLM_LAYOUTS)
def test_vllm_layout_from_strides_is_the_c_fillers_and_vllms_elements(layout: str) -> None:
    L, B, H, N, D = 3, 5, 4, 16, 8
    raw, views = vllm_layout.numpy_layer_views(np, layout, L, B, H, N, D)
    raw[:] = np.arange(raw.size) % 251
    d = c_desc_v1(L, B, N, H, D, layout)
    base = raw.ctypes.data
    for layer, v in enumerate(views):
        assert v.shape == (B, H, N, 2 * D)
        lay = kg.layout_of(v.shape, [s // 2 for s in v.strides], "vllm")
        assert (lay.num_blocks, lay.heads, lay.block_size, lay.head_dim) == (B, H, N, D)
        assert (lay.stride_block, lay.stride_token, lay.stride_head, lay.k_offset,
                lay.v_offset) == (d.stride_block, d.stride_token, d.stride_head, d.k_offset,
                                  d.v_offset)
        # Every element through the derived strides is the view's element.
        flat = np.frombuffer(raw, np.uint16, count=raw.size // 2)
        start = (v.ctypes.data - base) // 2
        for b in range(B):
            for h in range(H):
                for n in range(N):
                    for kind in (0, 1):
                        at = start + (lay.v_offset if kind else lay.k_offset) + \
                            b * lay.stride_block + n * lay.stride_token + h * lay.stride_head
                        want = v[b, h, n, kind * D:(kind + 1) * D]
                        assert np.array_equal(flat[at:at + D], want), (layout, layer, b, h, n)


def test_padded_pages_keep_their_block_stride() -> None:
    L, B, H, N, D = 2, 4, 2, 16, 8
    page = H * N * 2 * D * 2
    _, views = vllm_layout.numpy_layer_views(np, "LBNHC", L, B, H, N, D,
                                             page_size_padded=page + 256)
    lay = kg.layout_of(views[0].shape, [s // 2 for s in views[0].strides])
    assert lay.stride_block == (page + 256) // 2
    assert (lay.stride_token, lay.stride_head) == (H * 2 * D, 2 * D)


def test_legacy_vllm_layout_is_the_legacy_fillers() -> None:
    B, N, H, D = 6, 16, 4, 8
    a = np.zeros((2, B, N, H, D), np.uint16)
    lay = kg.layout_of(a.shape, [s // 2 for s in a.strides], "vllm-legacy")
    d = kg.kvt_gpu_layout_desc()
    ptrs = (ctypes.c_void_p * 1)(16)
    lib.kvt_gpu_layout_desc_vllm(ctypes.byref(d), 1, 1, ptrs, B, N, H, D)
    assert (lay.stride_block, lay.stride_token, lay.stride_head, lay.k_offset,
            lay.v_offset) == (d.stride_block, d.stride_token, d.stride_head, d.k_offset,
                              d.v_offset)
    assert lay.v_offset == B * N * H * D


def test_unknown_layouts_and_shapes_are_refused() -> None:
    with pytest.raises(kvtier.Error) as e:
        kg.layout_of((4, 2, 16), (512, 256, 1))
    assert e.value.code == ErrorCode.ESHAPE and "2*head_dim" in e.value.detail
    with pytest.raises(kvtier.Error) as e:
        kg.layout_of((4, 2, 16, 7), (224, 112, 7, 1))
    assert e.value.code == ErrorCode.ESHAPE
    with pytest.raises(kvtier.Error) as e:  # K/V rows not contiguous
        kg.layout_of((4, 2, 16, 8), (256, 128, 8, 2))
    assert e.value.code == ErrorCode.ESHAPE and "contiguous" in e.value.detail
    with pytest.raises(kvtier.Error):
        kg.layout_of((3, 4, 16, 2, 8), (1, 1, 1, 1, 1), "vllm-legacy")
    with pytest.raises(ValueError, match="vllm-legacy"):
        kg.layout_of((4, 2, 16, 8), (256, 128, 8, 1), "flashinfer")
    assert kg.vllm_layout_name("nhd") == "LBNHC" and kg.vllm_layout_name("HND") == "LBHNC"
    with pytest.raises(ValueError, match="BHLNC"):
        kg.vllm_layout_name("NHC")
    # The C filler leaves an unknown layout unusable.
    d = kg.kvt_gpu_layout_desc()
    ptrs = (ctypes.c_void_p * 1)(16)
    lib.kvt_gpu_layout_desc_vllm_v1(ctypes.byref(d), 1, 1, ptrs, 4, 16, 2, 8, 6)
    assert d.layers == 0


@dataclass
class FullAttentionSpec:  # vLLM's fields, duck-typed
    block_size: int = 16
    num_kv_heads: int = 8
    head_size: int = 128
    head_size_v: int = 128
    dtype: str = "torch.bfloat16"
    kv_quant_mode: int = 0


@dataclass
class MLAAttentionSpec(FullAttentionSpec):
    head_size_v: int = 0


@dataclass
class MambaSpec:
    block_size: int = 16


def test_vllm_specs_kvtier_cannot_store_are_refused_with_the_reason() -> None:
    kg.check_vllm_spec(FullAttentionSpec())
    kg.check_vllm_spec(FullAttentionSpec(dtype="torch.float16"))
    cases: List[Any] = [
        (MLAAttentionSpec(), "MLA"),
        (FullAttentionSpec(kv_quant_mode=1), "quantized"),
        (FullAttentionSpec(dtype="torch.float8_e4m3fn"), "float8_e4m3fn"),
        (FullAttentionSpec(head_size_v=64), "differ"),
        (MambaSpec(), "Mamba"),
    ]
    for spec, why in cases:
        with pytest.raises(kvtier.Error) as e:
            kg.check_vllm_spec(spec)
        assert e.value.code == ErrorCode.ENOTSUP and why in e.value.detail, spec


def test_pinned_buffers_need_a_gpu() -> None:
    if kvtier.has_feature("cuda"):
        try:
            with kg.PinnedBuffer(4096) as b:
                assert kg.mem_kind(b.ptr) == kg.MEM_PINNED
                assert len(b) == 4096 and b.array.nbytes == 4096 and b.ptr % 4096 == 0
            return
        except kvtier.Error as e:  # a CUDA build on a machine without a device
            assert e.code == ErrorCode.ENOTSUP, e
            return
    with pytest.raises(kvtier.Error) as e:
        kg.PinnedBuffer(4096)
    assert e.value.code == ErrorCode.ENOTSUP
    with pytest.raises(ValueError):
        kg.PinnedBuffer(0)


_LAYOUT_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "kvtier/gpu.h"
#define F(s, f) printf(#s "." #f " %zu %zu\n", offsetof(s, f), sizeof(((s *)0)->f))
int main(void) {
  printf("kvt_gpu_layout_desc %zu\n", sizeof(kvt_gpu_layout_desc));
  printf("kvt_gpu_store_params %zu\n", sizeof(kvt_gpu_store_params));
  printf("kvt_gpu_load_params %zu\n", sizeof(kvt_gpu_load_params));
  printf("kvt_gpu_verdict %zu\n", sizeof(kvt_gpu_verdict));
%s
  return 0;
}
"""


def test_gpu_struct_mirrors_match_the_c_compiler(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler to compare the struct layouts with")
    structs = (kg.kvt_gpu_layout_desc, kg.kvt_gpu_store_params, kg.kvt_gpu_load_params,
               kg.kvt_gpu_verdict)
    fields = "\n".join(f"  F({s.__name__}, {f[0]});" for s in structs for f in s._fields_)
    include = Path(os.environ.get("KVT_SOURCE_DIR") or REPO) / "include"
    if not (include / "kvtier" / "gpu.h").is_file():
        pytest.skip(f"no kvtier headers at {include} (set KVT_SOURCE_DIR)")
    src = tmp_path / "layout.c"
    src.write_text(_LAYOUT_C.replace("%s", fields))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{include}", str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    want = {}
    for s in structs:
        want[s.__name__] = f"{ctypes.sizeof(s)}"
        for name, _ in s._fields_:
            f = getattr(s, name)
            want[f"{s.__name__}.{name}"] = f"{f.offset} {f.size}"
    got = dict(line.split(" ", 1) for line in out.splitlines())
    assert got == want


def test_layer_views_match_vllms_own_functions() -> None:
    """Where vLLM (and torch) are installed: vllm_layout's views are the ones
    vLLM's create_kv_cache_views makes, and kvtier derives their layout."""
    stand_in = getattr(sys.modules.get("vllm"), "__kvtier_stand_in__", False)
    if not HAVE_TORCH or stand_in or importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM and torch are not installed (.ci/run installs the pinned vLLM)")
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec as Spec
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout

    L, B, H, N, D = 3, 6, 4, 16, 8
    spec = Spec(block_size=N, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    for name in kg.VLLM_LAYOUTS:
        raw, mine = vllm_layout.torch_layer_views(torch, name, L, B, H, N, D, torch.bfloat16,
                                                   "cpu")
        layout = KVCacheLayout[name]
        order = layout.stride_order
        page = spec.page_size_bytes
        # One backing tensor holds the L layers; its layer and block strides
        # are those of the dense layout (what vLLM's planner sets).
        strides = vllm_layout.layout_strides((L, B, H, N, 2 * D * 2), name)
        kvt = KVCacheTensor(size=raw.numel(), layers=[f"l{i}" for i in range(L)],
                            layer_stride=strides[0], block_stride=strides[1])
        theirs = create_kv_cache_views(raw, spec, B, layout, kvt)
        assert order == vllm_layout.ORDERS[name] and page == H * N * 2 * D * 2
        for a, b in zip(mine, theirs):
            assert a.shape == b.shape and a.stride() == b.stride(), name
            assert a.data_ptr() == b.data_ptr(), name
            assert kg.layout_of(b.shape, b.stride()) == kg.layout_of(a.shape, a.stride())


def test_a_failed_verdict_is_raised_every_time_it_is_asked() -> None:
    """Transfer of a load verified on the GPU: the verdict's error is raised
    by every later wait() and done(), not only the first (a caller polling
    done() in one place and waiting elsewhere must not see success), and
    what the transfer keeps alive is released either way."""

    class Event:
        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

    calls = []

    def check() -> None:
        calls.append(1)
        raise kvtier.Error(ErrorCode.ECHECKSUM, detail="section 3: checksum mismatch")

    t = kg.Transfer(Event(), [bytearray(8)], check)
    for ask in (t.done, t.wait, t.wait, t.done):
        with pytest.raises(kvtier.Error) as e:
            ask()
        assert e.value.code == ErrorCode.ECHECKSUM
    assert calls == [1] and t._keep is None
    ok = kg.Transfer(Event(), [bytearray(8)], lambda: None)
    assert ok.done() and ok.wait() is None and ok._keep is None
