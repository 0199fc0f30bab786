"""vLLM 0.33's KV cache allocation, re-derived for tests and benchmarks that
run without vLLM: the strides of vllm/v1/kv_cache_interface.py
compute_layout_strides and the per-layer views of create_kv_cache_views
(vLLM, Apache-2.0, Copyright contributors to the vLLM project), over the
KVCacheLayout permutations of vllm/v1/kv_cache_layout.py.

A layer's view has logical shape [num_blocks, heads, block_size, 2*head_size]
(K in [..., :head_size], V after it); the layout orders the logical axes
[L, B, H, N, C] in memory. test_gpu.py checks these views against vLLM's own
functions where vLLM is installed.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

# KVCacheLayout members: the logical axes [L, B, H, N, C] in physical order.
ORDERS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def layout_strides(shape: Sequence[int], layout: str,
                   page_size_padded: Optional[int] = None) -> Tuple[int, ...]:
    """compute_layout_strides: strides (in the units of `shape`'s last axis,
    bytes in vLLM) of the logical [L, B, H, N, C] axes, innermost physical
    axis first; a padded page widens the stride of the axis just outside
    the page."""
    order = ORDERS[layout]
    page_grid_end = max(order.index(0), order.index(1)) + 1
    strides = [0] * 5
    cur = 1
    for physical_idx, dim in reversed(tuple(enumerate(order))):
        if page_size_padded is not None and physical_idx == page_grid_end - 1:
            cur = max(cur, page_size_padded)
        strides[dim] = cur
        cur = strides[dim] * shape[dim]
    return tuple(strides)


def _extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def torch_layer_views(torch: Any, layout: str, layers: int, num_blocks: int, heads: int,
                      block_size: int, head_size: int, dtype: Any, device: Any,
                      page_size_padded: Optional[int] = None) -> Tuple[Any, List[Any]]:
    """(raw int8 backing, per-layer views) as create_kv_cache_views makes
    them: a flat int8 buffer viewed 5-D with byte strides, each layer's view
    `.view(dtype)`. Returns the backing too (it owns the memory)."""
    elem = torch.empty((), dtype=dtype).element_size()
    shape = (layers, num_blocks, heads, block_size, 2 * head_size * elem)
    strides = layout_strides(shape, layout, page_size_padded)
    raw = torch.zeros(_extent(shape, strides), dtype=torch.int8, device=device)
    view5 = torch.as_strided(raw, size=shape, stride=strides, storage_offset=0)
    return raw, [view5[layer].view(dtype) for layer in range(layers)]


def numpy_layer_views(np: Any, layout: str, layers: int, num_blocks: int, heads: int,
                      block_size: int, head_size: int,
                      page_size_padded: Optional[int] = None) -> Tuple[Any, List[Any]]:
    """The same over a numpy uint8 buffer, each layer viewed as uint16."""
    shape = (layers, num_blocks, heads, block_size, 2 * head_size * 2)
    strides = layout_strides(shape, layout, page_size_padded)
    raw = np.zeros(_extent(shape, strides), np.uint8)
    view5 = np.lib.stride_tricks.as_strided(raw, shape=shape, strides=strides)
    return raw, [view5[layer].view(np.uint16) for layer in range(layers)]


def canonical_pages(torch: Any, view: Any, num_blocks: int, page_bytes: int) -> Any:
    """One layer's (num_blocks, page_bytes) int8 tensor as vLLM 0.33's
    OffloadingConnectorWorker.register_kv_caches hands it to an
    OffloadingSpec worker (CanonicalKVCacheTensor.tensor)."""
    elem = view.element_size()
    return torch.tensor([], dtype=torch.int8, device=view.device).set_(
        view.untyped_storage(), view.storage_offset() * elem, (num_blocks, page_bytes),
        (view.stride(0) * elem, 1))
