"""Encode and decode through the binding: every preset, both dtypes, strided
views, the CLI's bytes, and the errors the codec reports."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import as_float, kv_arrays

import kvtier
from kvtier import ErrorCode

DTYPES = ("bf16", "fp16")
# Largest relative error (max |x - x'| / max |x|) each element format may show.
TOLERANCE = {kvtier.Fmt.N16: 0.0, kvtier.Fmt.E4M3: 0.07, kvtier.Fmt.I8: 0.01,
             kvtier.Fmt.I4: 0.2}


def test_presets_are_the_ones_the_library_names() -> None:
    with pytest.raises(kvtier.Error) as e:
        kvtier.CodecSpec("no-such-preset")
    assert e.value.code == ErrorCode.ESPEC and e.value.name == "KVT_ESPEC"
    listed = re.search(r"\(([^)]*)\)", e.value.detail).group(1).split(", ")
    assert tuple(listed) == kvtier.PRESETS


@pytest.mark.parametrize("preset", kvtier.PRESETS)
def test_preset_specs_format_back_to_their_name(preset: str) -> None:
    spec = kvtier.CodecSpec(preset)
    assert str(spec) == preset
    assert spec == preset and hash(spec) == hash(kvtier.CodecSpec(preset))


def test_codec_spec_fields_and_raw_layers() -> None:
    spec = kvtier.CodecSpec("k=n16,v=i4,group=64,raw=0,30-31")
    assert (spec.k_fmt, spec.v_fmt, spec.group) == (kvtier.Fmt.N16, kvtier.Fmt.I4, 64)
    assert spec.raw_layers == {0, 30, 31}
    assert spec.layer_fmt(0, value=True) == kvtier.Fmt.N16
    assert spec.layer_fmt(5, value=True) == kvtier.Fmt.I4
    assert kvtier.CodecSpec(str(spec)) == spec


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preset", kvtier.PRESETS)
def test_round_trip_of_every_preset(preset: str, dtype: str, rng: np.random.Generator) -> None:
    shape = (3, 32, 4, 64)
    k, v = kv_arrays(rng, shape, dtype)
    payload = kvtier.encode(k, v, preset, dtype=dtype)
    assert len(payload) == kvtier.encode_bound(preset, *shape)
    info = kvtier.verify(payload)
    assert (info.layers, info.tokens, info.heads, info.head_dim) == shape
    assert info.dtype == dtype and info.codec == preset
    k2, v2 = kvtier.decode(payload)
    assert k2.shape == shape and v2.shape == shape
    spec = kvtier.CodecSpec(preset)
    for src, out, fmt in ((k, k2, spec.k_fmt), (v, v2, spec.v_fmt)):
        if fmt == kvtier.Fmt.N16:
            assert np.array_equal(src.view(np.uint16), out.view(np.uint16))
        else:
            a, b = as_float(src, dtype), as_float(out, dtype)
            assert np.abs(a - b).max() <= TOLERANCE[fmt] * np.abs(a).max()


@pytest.mark.parametrize("preset", kvtier.PRESETS)
def test_strided_views_encode_like_dense_copies(preset: str, rng: np.random.Generator) -> None:
    # K and V side by side in one row per (token, head), heads before tokens
    # in memory: nothing dense about it.
    T, H, D = 48, 4, 64
    rows = rng.standard_normal((H, T, 2 * D), dtype=np.float32).astype(np.float16)
    k = rows[:, :, :D].transpose(1, 0, 2)
    v = rows[:, :, D:].transpose(1, 0, 2)
    assert not k.flags.c_contiguous
    strided = kvtier.encode(k, v, preset)
    dense = kvtier.encode(np.ascontiguousarray(k), np.ascontiguousarray(v), preset)
    assert strided == dense


def test_raw_pointer_tensors_encode_and_decode_in_place(rng: np.random.Generator) -> None:
    # kvtier.sglang describes host pages by address, shape and element
    # strides (no array object): encode() and decode() take such a Tensor.
    from kvtier._buffers import DTYPE_BF16, Tensor

    L, T, H, D = 2, 8, 2, 32
    k, v = kv_arrays(rng, (T, L, H, D), "bf16")  # token-major, as a page_first page
    view = [Tensor(a.ctypes.data, (L, T, H, D), (H * D, L * H * D, D), DTYPE_BF16, True, a)
            for a in (k, v)]
    payload = kvtier.encode(view[0], view[1], "k16v8")
    assert payload == kvtier.encode(k.transpose(1, 0, 2, 3), v.transpose(1, 0, 2, 3), "k16v8",
                                    dtype="bf16")
    want_k, want_v = kvtier.decode(payload)
    k[:], v[:] = 0, 0
    kvtier.decode(payload, view[0], view[1])
    assert np.array_equal(k.transpose(1, 0, 2, 3), want_k)
    assert np.array_equal(v.transpose(1, 0, 2, 3), want_v)


def test_decode_into_given_strided_arrays(rng: np.random.Generator) -> None:
    T, H, D = 32, 2, 64
    k, v = kv_arrays(rng, (T, H, D), "fp16")
    payload = kvtier.encode(k, v, "k16v8")
    want_k, want_v = kvtier.decode(payload)
    rows = np.zeros((H, T, 2 * D), np.float16)
    dk, dv = rows[:, :, :D].transpose(1, 0, 2), rows[:, :, D:].transpose(1, 0, 2)
    got_k, got_v = kvtier.decode(payload, dk, dv)
    assert got_k is dk and got_v is dv
    assert np.array_equal(dk, want_k[0]) and np.array_equal(dv, want_v[0])


def test_decode_a_layer_range(rng: np.random.Generator) -> None:
    k, v = kv_arrays(rng, (4, 16, 2, 32), "bf16")
    payload = kvtier.encode(k, v, "raw", dtype="bf16")
    k2, v2 = kvtier.decode(payload, layer_first=1, layer_count=2)
    assert np.array_equal(k2, k[1:3]) and np.array_equal(v2, v[1:3])


def test_encode_into_a_caller_buffer_and_too_small_one(rng: np.random.Generator) -> None:
    k, v = kv_arrays(rng, (16, 2, 64), "fp16")
    bound = kvtier.encode_bound("int4", 1, 16, 2, 64)
    out = np.zeros(bound, np.uint8)
    n = kvtier.encode_into(out, k, v, "int4")
    assert bytes(out[:n]) == kvtier.encode(k, v, "int4")
    with pytest.raises(kvtier.Error) as e:
        kvtier.encode_into(bytearray(n - 1), k, v, "int4")
    assert e.value.code == ErrorCode.ENOBUFS and e.value.name == "KVT_ENOBUFS"


def test_payload_accepted_as_any_buffer(rng: np.random.Generator) -> None:
    k, v = kv_arrays(rng, (16, 2, 64), "fp16")
    payload = kvtier.encode(k, v, "fp8")
    for form in (payload, bytearray(payload), memoryview(payload),
                 np.frombuffer(payload, np.uint8)):
        k2, _ = kvtier.decode(form)
        assert k2.shape == (1, 16, 2, 64)


@pytest.mark.skipif(not kvtier.has_feature("zstd"), reason="library built without zstd")
def test_zstd_stage_round_trips_and_sets_the_flag() -> None:
    k = np.zeros((2, 64, 2, 64), np.float16)
    k[:, :, :, ::4] = 1.5
    payload = kvtier.encode(k, k, "raw", zstd_level=3)
    info = kvtier.verify(payload)
    assert info.lossless
    assert any(s.comp != kvtier.Comp.NONE for s in kvtier.sections(payload))
    k2, v2 = kvtier.decode(payload)
    assert np.array_equal(k2, k) and np.array_equal(v2, k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preset", kvtier.PRESETS)
def test_bytes_equal_the_cli_encode(cli, tmp_path, preset: str, dtype: str,
                                    rng: np.random.Generator) -> None:
    L, T, H, D = 2, 32, 4, 64
    k, v = kv_arrays(rng, (L, T, H, D), dtype)
    k.tofile(tmp_path / "k.bin")
    v.tofile(tmp_path / "v.bin")
    out = tmp_path / "p.kvt"
    cli("encode", "--codec", preset, "--dtype", dtype, "--layers", L, "--tokens", T,
        "--heads", H, "--head-dim", D, "--k", tmp_path / "k.bin", "--v", tmp_path / "v.bin",
        "-o", out, "--model-id", "py-test", "--layer-begin", 3, "--model-layers", 8)
    fp = kvtier.fingerprint(kvtier.ModelDesc("py-test", layers=8, kv_heads=H, head_dim=D,
                                             dtype=dtype), preset)
    key = kvtier.chunk_key(fp, range(T))
    ours = kvtier.encode(k, v, preset, dtype=dtype, key=key, fingerprint=fp, layer_begin=3,
                         model_layers=8)
    assert ours == out.read_bytes()


def test_bytes_equal_the_cli_encode_of_a_later_chunk_with_zstd(cli, tmp_path,
                                                                rng: np.random.Generator) -> None:
    if not kvtier.has_feature("zstd"):
        pytest.skip("library built without zstd")
    T, H, D = 16, 2, 64
    k, v = kv_arrays(rng, (1, T, H, D), "bf16")
    ids = rng.integers(0, 128256, 3 * T, dtype=np.uint32)
    for name, a in (("k", k), ("v", v), ("ids", ids)):
        a.tofile(tmp_path / f"{name}.bin")
    cli("encode", "--codec", "k16v4", "--dtype", "bf16", "--layers", 1, "--tokens", T,
        "--heads", H, "--head-dim", D, "--k", tmp_path / "k.bin", "--v", tmp_path / "v.bin",
        "-o", tmp_path / "p.kvt", "--tokens-file", tmp_path / "ids.bin", "--zstd", 5)
    fp = kvtier.fingerprint(kvtier.ModelDesc("unknown-model", 1, H, D), "k16v4")
    key = kvtier.chunk_keys(fp, ids, T)[-1]
    ours = kvtier.encode(k, v, "k16v4", dtype="bf16", key=key, fingerprint=fp,
                         token_begin=2 * T, zstd_level=5)
    assert ours == (tmp_path / "p.kvt").read_bytes()


@pytest.mark.parametrize("preset", ("k16v8", "int4"))
def test_decode_equals_the_cli_decode(cli, tmp_path, preset: str,
                                      rng: np.random.Generator) -> None:
    k, v = kv_arrays(rng, (2, 32, 2, 64), "bf16")
    payload = kvtier.encode(k, v, preset, dtype="bf16")
    (tmp_path / "p.kvt").write_bytes(payload)
    cli("decode", tmp_path / "p.kvt", "--k", tmp_path / "k.bin", "--v", tmp_path / "v.bin")
    k2, v2 = kvtier.decode(payload)
    assert k2.tobytes() == (tmp_path / "k.bin").read_bytes()
    assert v2.tobytes() == (tmp_path / "v.bin").read_bytes()


# --- errors -------------------------------------------------------------------


def test_nonfinite_value_names_its_place() -> None:
    k = np.ones((2, 8, 2, 32), np.float16)
    v = k.copy()
    v[1, 5, 1, 7] = np.nan
    with pytest.raises(kvtier.Error) as e:
        kvtier.encode(k, v, "fp8")
    assert e.value.code == ErrorCode.ENONFINITE and e.value.name == "KVT_ENONFINITE"
    assert "layer 1" in e.value.detail and "token 5" in e.value.detail
    assert "head 1" in e.value.detail


def test_k_and_v_of_different_shapes_are_a_shape_error() -> None:
    with pytest.raises(kvtier.Error) as e:
        kvtier.encode(np.zeros((8, 2, 32), np.float16), np.zeros((8, 2, 64), np.float16))
    assert e.value.code == ErrorCode.ESHAPE and e.value.name == "KVT_ESHAPE"


def test_head_vectors_must_be_contiguous() -> None:
    k = np.zeros((8, 2, 64), np.float16)[:, :, ::2]
    with pytest.raises(kvtier.Error) as e:
        kvtier.encode(k, k, "raw")
    assert e.value.code == ErrorCode.ESHAPE and "stride" in e.value.detail


def test_shape_the_codec_cannot_take_is_a_shape_error() -> None:
    k = np.zeros((8, 2, 30), np.float16)  # i4 groups of 32 along dim do not divide 30
    with pytest.raises(kvtier.Error) as e:
        kvtier.encode(k, k, "int4,kgroup=dim")
    assert e.value.code == ErrorCode.ESHAPE


def test_integer_arrays_need_a_dtype_and_other_types_are_refused() -> None:
    k = np.zeros((8, 2, 32), np.uint16)
    with pytest.raises(ValueError, match="dtype"):
        kvtier.encode(k, k)
    with pytest.raises(kvtier.Error) as e:
        kvtier.encode(np.zeros((8, 2, 32), np.float32), np.zeros((8, 2, 32), np.float32))
    assert e.value.code == ErrorCode.ESHAPE
    with pytest.raises(TypeError):
        kvtier.encode([[[0]]], [[[0]]])


def test_decode_into_arrays_of_another_shape_is_a_shape_error(rng) -> None:
    k, v = kv_arrays(rng, (16, 2, 32), "fp16")
    payload = kvtier.encode(k, v, "raw")
    wrong = np.zeros((8, 2, 32), np.float16)
    with pytest.raises(kvtier.Error) as e:
        kvtier.decode(payload, wrong, wrong.copy())
    assert e.value.code == ErrorCode.ESHAPE and e.value.detail
    bf = np.zeros((16, 2, 32), np.uint16)  # integers: taken as the payload's dtype
    kvtier.decode(payload, bf, bf.copy())
    assert np.array_equal(bf.view(np.float16), k)


def _payload(rng) -> bytes:
    k, v = kv_arrays(rng, (2, 16, 2, 64), "bf16")
    return kvtier.encode(k, v, "k16v8", dtype="bf16")


def test_a_damaged_section_is_a_checksum_error(rng) -> None:
    payload = bytearray(_payload(rng))
    last = kvtier.sections(payload)[-1]
    payload[last.offset + 5] ^= 0x10
    kvtier.inspect(payload)  # the header is intact
    for call in (kvtier.verify, kvtier.decode):
        with pytest.raises(kvtier.Error) as e:
            call(payload)
        assert e.value.code == ErrorCode.ECHECKSUM and e.value.name == "KVT_ECHECKSUM"
        assert e.value.detail


def test_a_damaged_header_truncation_and_foreign_bytes_are_refused(rng) -> None:
    good = _payload(rng)
    header = bytearray(good)
    header[40] ^= 1
    with pytest.raises(kvtier.Error) as e:
        kvtier.inspect(header)
    assert e.value.code in (ErrorCode.ECHECKSUM, ErrorCode.ECORRUPT)
    with pytest.raises(kvtier.Error) as e:
        kvtier.verify(good[: len(good) - 64])
    assert e.value.code == ErrorCode.ETRUNC and e.value.name == "KVT_ETRUNC"
    with pytest.raises(kvtier.Error) as e:
        kvtier.inspect(b"GIF89a" + good[6:])
    assert e.value.code == ErrorCode.EFORMAT


def test_expectations_refuse_another_chunk(rng) -> None:
    k, v = kv_arrays(rng, (16, 2, 64), "fp16")
    fp = kvtier.fingerprint(kvtier.ModelDesc("m", 1, 2, 64, dtype="fp16"), "raw")
    key = kvtier.chunk_key(fp, range(16))
    payload = kvtier.encode(k, v, "raw", key=key, fingerprint=fp)
    kvtier.decode(payload, expect_key=key, expect_fingerprint=fp)
    other = kvtier.chunk_key(fp, range(1, 17))
    with pytest.raises(kvtier.Error) as e:
        kvtier.decode(payload, expect_key=other)
    assert e.value.code == ErrorCode.EFOREIGN and e.value.name == "KVT_EFOREIGN"


def test_torch_cpu_tensors_encode_in_place(rng) -> None:
    torch = pytest.importorskip("torch", reason="torch is optional; not installed here")
    k = torch.randn(2, 16, 2, 64, dtype=torch.bfloat16)
    v = torch.randn(2, 16, 2, 64, dtype=torch.bfloat16)
    bits_k = k.view(torch.int16).numpy().view(np.uint16)
    bits_v = v.view(torch.int16).numpy().view(np.uint16)
    assert kvtier.encode(k, v, "k16v8") == kvtier.encode(bits_k, bits_v, "k16v8", dtype="bf16")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    kvtier.decode(kvtier.encode(k, v, "raw"), dk, dv)
    assert torch.equal(dk, k) and torch.equal(dv, v)
