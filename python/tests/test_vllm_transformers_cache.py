"""kvtier.transformers.KvtierCache (issue 19, part 1) on a small randomly
initialised Llama built from a config (no weights, no download), in the vLLM
venv, which carries torch and transformers: raw restores every bit (the same
logits and generated tokens as transformers' DynamicCache), k16v8 keeps keys
bit-exact, a chunk the tiers cannot take stays exact, a second cache over the
same nvme directory restores the tracked prefix. (The file name puts it in
CTest's test_vllm, whose venv has torch and transformers.)"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch (./bootstrap.sh vllm makes the venv)")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers (./bootstrap.sh vllm)")

from kvtier.transformers import KvtierCache  # noqa: E402

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 3, 4, 2, 32
CHUNK = 8


@pytest.fixture(scope="module")
def model() -> object:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=HEADS * HEAD_DIM,
                                   intermediate_size=128, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                   max_position_embeddings=256, head_dim=HEAD_DIM)
    m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return m


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (1, n), generator=g)


def _two_steps(model, cache, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Logits of ids[split:] after a prefix pass over ids[:split] with cache."""
    with torch.inference_mode():
        model(ids[:, :split], past_key_values=cache, use_cache=True)
        return model(ids[:, split:], past_key_values=cache, use_cache=True).logits


def test_raw_is_bit_exact_against_dynamic_cache(model) -> None:
    ids = _ids(40)
    ref = _two_steps(model, transformers.DynamicCache(config=model.config), ids, 29)
    cache = KvtierCache(model.config, "dram:16MiB", codec="raw", chunk_tokens=CHUNK)
    got = _two_steps(model, cache, ids, 29)
    assert torch.equal(got, ref)
    assert cache.stored == 40 // CHUNK and cache.done == 40 // CHUNK * CHUNK
    assert cache.get_seq_length() == 40 and cache.tiers.stats().items == 5
    cache.close()


def test_generate_with_a_kvtier_cache_gives_the_same_tokens(model) -> None:
    ids = _ids(21, seed=2)
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
        cache = KvtierCache(model.config, "dram:16MiB", codec="raw", chunk_tokens=CHUNK)
        got = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False,
                             past_key_values=cache)
    assert torch.equal(got, ref)
    # Chunks completed while generating were offloaded too (the last token
    # generated is never fed back, so it is not cached).
    assert cache.get_seq_length() == got.shape[1] - 1 > 21 + CHUNK
    assert cache.done == (got.shape[1] - 1) // CHUNK * CHUNK
    cache.close()


def test_k16v8_keeps_keys_exact_and_values_close(model) -> None:
    ids = _ids(32, seed=3)
    dyn = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids, past_key_values=dyn, use_cache=True)
        cache = KvtierCache(model.config, "dram:16MiB", codec="k16v8", chunk_tokens=CHUNK)
        model(ids, past_key_values=cache, use_cache=True)
    for ours, ref in zip(cache.layers, dyn.layers):
        assert torch.equal(ours.keys, ref.keys)  # K16: bit-exact
        rel = (ours.values - ref.values).float().norm() / ref.values.float().norm()
        assert 0 < rel < 0.05  # V8 (e4m3 with scales): changed, and close
    cache.close()


def test_a_chunk_the_tiers_cannot_take_stays_exact(model) -> None:
    ids = _ids(16, seed=4)
    cache = KvtierCache(model.config, "dram:1KiB", codec="int4", chunk_tokens=CHUNK)
    dyn = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids, past_key_values=dyn, use_cache=True)
        model(ids, past_key_values=cache, use_cache=True)
    assert cache.misses == 2 and cache.stored == 0
    for ours, ref in zip(cache.layers, dyn.layers):
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    cache.close()


def test_a_second_cache_restores_the_tracked_prefix_from_nvme(model, tmp_path: Path) -> None:
    ids = _ids(36, seed=5)
    spec = f"nvme:{tmp_path}/kv:16MiB"
    first = KvtierCache(model.config, spec, codec="raw", chunk_tokens=CHUNK)
    first.track(ids[:, :30])
    ref = _two_steps(model, first, ids, 30)  # the second step is not tracked: not needed
    first.close()
    again = KvtierCache(model.config, spec, codec="raw", chunk_tokens=CHUNK)
    n = again.restore(ids[:, :30], dtype=torch.bfloat16)
    assert n == 24 and again.get_seq_length() == 24 and again.hits == 3
    with torch.inference_mode():
        model(ids[:, 24:30], past_key_values=again, use_cache=True)
        got = model(ids[:, 30:], past_key_values=again, use_cache=True).logits
    # raw restores the bits: the restored prefix and the recomputed tokens
    # 24-29 give the first run's logits exactly.
    assert torch.equal(got, ref)
    again.close()
    # Another codec (another fingerprint) or other tokens find nothing.
    other = KvtierCache(model.config, spec, codec="int4", chunk_tokens=CHUNK)
    assert other.restore(ids[:, :30]) == 0
    other.close()
    third = KvtierCache(model.config, spec, codec="raw", chunk_tokens=CHUNK)
    assert third.restore(_ids(30, seed=99)) == 0
    third.close()


def test_a_corrupt_payload_ends_the_restored_prefix(model, tmp_path: Path) -> None:
    ids = _ids(24, seed=6)
    first = KvtierCache(model.config, "dram:16MiB", codec="k16v8", chunk_tokens=CHUNK)
    first.track(ids)
    with torch.inference_mode():
        model(ids, past_key_values=first, use_cache=True)
    key = first.keys_[1]
    bad = bytearray(first.tiers.get(key))
    bad[-50] ^= 1  # a section byte: the header still parses
    first.tiers.delete(key)
    first.tiers.put(key, bytes(bad))
    again = KvtierCache(model.config, first.tiers, codec="k16v8", chunk_tokens=CHUNK)
    assert again.restore(ids, dtype=torch.bfloat16) == CHUNK  # chunk 0 only
    first.close()


def test_batches_are_refused(model) -> None:
    cache = KvtierCache(model.config, "dram:16MiB", chunk_tokens=CHUNK)
    with pytest.raises(ValueError, match="one sequence"), torch.inference_mode():
        model(torch.zeros((2, 4), dtype=torch.long), past_key_values=cache, use_cache=True)
    cache.close()
