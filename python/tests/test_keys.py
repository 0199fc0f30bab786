"""Keys and fingerprints: the C golden values, chaining, and separation."""

from __future__ import annotations

import numpy as np
import pytest

import kvtier

LLAMA = kvtier.ModelDesc("meta-llama/Llama-3.1-8B", layers=32, kv_heads=8, head_dim=128)


def _tokens(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.uint64) * 7919 % 128256).astype(np.uint32)


def test_golden_fingerprint_and_chunk_keys_of_tests_test_key_c() -> None:
    fp = kvtier.fingerprint(LLAMA, "k16v8")
    assert fp.hex() == "3abcab9dfa85437100ed970bc72bacca"
    keys = kvtier.chunk_keys(fp, _tokens(768), 256)
    assert [k.hex() for k in keys] == ["53f548eb172990c2e75d0f6799d31cf2",
                                       "63dadc4719b6826b3c3d8cb3dbdd1a8d",
                                       "1d67eae50faae5466055bc28eb23b78f"]


def test_chunk_keys_chain_like_single_calls_and_skip_a_partial_chunk() -> None:
    fp = kvtier.fingerprint(LLAMA, "int4")
    t = _tokens(1000)
    many = kvtier.chunk_keys(fp, t, 256)
    assert len(many) == 3
    assert many[0] == kvtier.chunk_key(fp, t[:256])
    assert many[2] == kvtier.chunk_key(fp, t[512:768], prev=many[1])
    assert kvtier.chunk_keys(fp, list(map(int, t)), 256) == many  # a list of ints too


def test_keys_separate_codecs_ranks_and_dtypes() -> None:
    fps = {kvtier.fingerprint(LLAMA, "k16v8"), kvtier.fingerprint(LLAMA, "raw"),
           kvtier.fingerprint(kvtier.ModelDesc(LLAMA.model_id, 32, 8, 128, tp_rank=1,
                                               tp_size=2), "k16v8"),
           kvtier.fingerprint(kvtier.ModelDesc(LLAMA.model_id, 32, 8, 128, dtype="fp16"),
                              "k16v8")}
    assert len(fps) == 4


def test_key_hex_bytes_and_equality() -> None:
    fp = kvtier.fingerprint(LLAMA, "k16v8")
    assert kvtier.Key(fp.hex()) == fp == kvtier.Key(bytes(fp))
    assert str(fp) == bytes(fp).hex()
    assert {fp: 1}[kvtier.Key(bytes(fp))] == 1
    with pytest.raises(kvtier.Error) as e:
        kvtier.Key("not hex")
    assert e.value.name == "EINVAL"
    with pytest.raises(ValueError):
        kvtier.Key(b"short")


def test_bad_model_desc_and_token_ids_are_refused() -> None:
    with pytest.raises(kvtier.Error) as e:
        kvtier.fingerprint(kvtier.ModelDesc("m", 32, 8, 128, tp_rank=2, tp_size=2), "raw")
    assert e.value.name == "EINVAL"
    fp = kvtier.fingerprint(LLAMA, "raw")
    with pytest.raises(ValueError):
        kvtier.chunk_key(fp, [-1, 2])
    with pytest.raises(ValueError):
        kvtier.chunk_key(fp, [2**32])
