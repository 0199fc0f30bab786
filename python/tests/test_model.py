"""The bandwidth model: project() gives what `kvtier project --json` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvtier


def _cli_json(cli, *args) -> dict:
    return json.loads(cli("project", "--json", *map(str, args)).stdout)


def test_project_defaults_equal_the_cli(cli) -> None:
    assert kvtier.project("llama-3.1-8b") == _cli_json(cli, "--model", "llama-3.1-8b")


def test_project_of_every_preset_and_codec_equals_the_cli(cli) -> None:
    codecs = list(kvtier.PRESETS) + ["k16v8,raw=0"]  # the CLI takes 8 at most
    args = ["--model", "all", "--batch", 8, "--context", "32K", "--step-ms", 25,
            "--spec-k", 2.5]
    for c in codecs:
        args += ["--codec", c]
    ours = kvtier.project("all", codecs, batch=8, context=32768, step_ms=25, spec_k=2.5)
    assert ours == _cli_json(cli, *args)
    assert len(ours["models"]) == len(kvtier.model_presets())


def test_project_with_weights_links_and_overrides_equals_the_cli(cli) -> None:
    links = ["pcie5-x16", "nvme-gen5", "slow=0.5"]
    args = ["--model", "qwen2.5-7b", "--model", "gemma3-12b", "--codec", "k16v8",
            "--codec", "int4,kgroup=dim", "--weights", "--weight-bits", 8, "--context", 1000000]
    for ln in links:
        args += ["--link", ln]
    ours = kvtier.project(["qwen2.5-7b", "gemma3-12b"], ["k16v8", "int4,kgroup=dim"],
                          context=1000000,
                          links=links, weights=True, weight_bits=8)
    assert ours == _cli_json(cli, *args)
    assert "amdahl_bound" in ours["models"][0]["codecs"][0]


def test_project_of_a_config_json_and_a_custom_arch_equals_the_cli(cli, tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 2, "hidden_size": 512, "intermediate_size": 1024,
           "vocab_size": 1000, "sliding_window": 256, "layer_types":
           ["sliding_attention", "full_attention"] * 2}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg))
    ours = kvtier.project(str(path), ["raw", "int4"], context=4096, params=1.5e9)
    assert ours == _cli_json(cli, "--model", path, "--codec", "raw", "--codec", "int4",
                             "--context", 4096, "--params", "1.5B")
    m = ours["models"][0]
    assert m["name"] == "tiny" and m["window"] == 256
    arch = kvtier.ModelArch("custom", layers=6, kv_heads=4, k_dim=96)
    assert kvtier.project(arch, ["k8v4"]) == _cli_json(
        cli, "--layers", 6, "--kv-heads", 4, "--head-dim", 96, "--codec", "k8v4")
    windowed = kvtier.ModelArch("custom", layers=4, kv_heads=2, k_dim=64, window=512,
                                window_layers=frozenset(range(4)))
    ours = kvtier.project(windowed, ["raw"])
    assert ours == _cli_json(cli, "--layers", 4, "--kv-heads", 2, "--head-dim", 64,
                             "--window", 512, "--codec", "raw")
    assert None in [ln["max_context"] for ln in ours["models"][0]["codecs"][0]["links"]]


def test_model_presets_links_and_rates() -> None:
    llama = kvtier.model_preset("Llama-3.1-8B")
    assert (llama.layers, llama.kv_heads, llama.k_dim) == (32, 8, 128)
    assert llama in kvtier.model_presets()
    assert kvtier.link("pcie5-x16").GBps == 64
    assert [ln.name for ln in kvtier.link_presets()][0] == "hbm3-h100"
    raw, k16v8 = kvtier.kv_rate(llama, "raw"), kvtier.kv_rate(llama, "k16v8")
    assert raw.full_bytes == 32 * 8 * 2 * 128 * 2
    assert raw.bytes_per_element == 2.0 and k16v8.full_bytes < raw.full_bytes
    assert raw.seq_bytes(1000) == raw.full_bytes * 1000


def test_model_errors() -> None:
    with pytest.raises(kvtier.Error) as e:
        kvtier.model_preset("no-such-model")
    assert e.value.name == "KVT_ENOTFOUND"
    with pytest.raises(kvtier.Error) as e:
        kvtier.model_from_hf_config('{"num_hidden_layers": 4,')
    assert e.value.name == "KVT_ECORRUPT" and e.value.detail
    with pytest.raises(kvtier.Error) as e:
        kvtier.kv_rate(kvtier.ModelArch("bad", layers=0, kv_heads=1, k_dim=64), "raw")
    assert e.value.name == "KVT_ESHAPE"
    with pytest.raises(ValueError, match="params"):
        kvtier.project(kvtier.ModelArch("c", 2, 2, 64), weights=True)
