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


# --- from the issue-19 review: each of these failed at ee8b2a6 ---------------------


def test_a_chunk_refilled_after_crop_gets_the_new_tokens_kv(model) -> None:
    # Assisted decoding: candidates are fed, the rejected ones cropped, others
    # fed. Chunk 0 is offloaded with 2 candidates in it; after the crop it is
    # refilled under the same salt key, put() keeps the old payload ("a key
    # already held is not written again"), and get() installs the rejected
    # candidates' K/V at positions 6 and 7.
    a, cand, other, nxt = _ids(6), _ids(4, seed=2), _ids(4, seed=3), _ids(3, seed=4)

    def run(cache):
        with torch.inference_mode():
            model(a, past_key_values=cache, use_cache=True)
            model(cand, past_key_values=cache, use_cache=True)
            cache.crop(-4)
            model(other, past_key_values=cache, use_cache=True)
            return model(nxt, past_key_values=cache, use_cache=True).logits

    ref = run(transformers.DynamicCache(config=model.config))
    cache = KvtierCache(model.config, "dram:16MiB", codec="raw", chunk_tokens=CHUNK)
    assert torch.equal(run(cache), ref)
    cache.close()


def test_prompt_lookup_generate_gives_the_same_tokens(model) -> None:
    # The same defect through model.generate (prompt lookup crops the cache).
    ids = _ids(5, seed=0).repeat(1, 3)
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, prompt_lookup_num_tokens=4)
    with torch.inference_mode():
        ref = model.generate(ids, past_key_values=transformers.DynamicCache(config=model.config),
                             **kw)
        cache = KvtierCache(model.config, "dram:16MiB", codec="raw", chunk_tokens=CHUNK)
        got = model.generate(ids, past_key_values=cache, **kw)
    assert torch.equal(got, ref)
    cache.close()


def test_track_after_an_untracked_forward_never_keys_other_tokens_kv(model) -> None:
    # track() starting after 4 untracked tokens: self.ids[0:8] are the tokens
    # at positions 4..11 but key the K/V of positions 0..7; a restore of those
    # tokens gets K/V that are not theirs (a shared tier is poisoned).
    x = _ids(16, seed=7)
    first = KvtierCache(model.config, "dram:16MiB", codec="raw", chunk_tokens=CHUNK)
    with torch.inference_mode():
        model(x[:, :4], past_key_values=first, use_cache=True)
        try:
            first.track(x[:, 4:])
        except ValueError:
            return  # a fix may refuse the misaligned track()
        model(x[:, 4:], past_key_values=first, use_cache=True)
    again = KvtierCache(model.config, first.tiers, codec="raw", chunk_tokens=CHUNK)
    n = again.restore(x[:, 4:], dtype=torch.bfloat16)
    dyn = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        model(x[:, 4:4 + n], past_key_values=dyn, use_cache=True)
    assert n == 0 or torch.equal(again.layers[0].keys, dyn.layers[0].keys)
    first.close()


def test_reset_starts_the_offload_bookkeeping_again(model) -> None:
    # reset() (inherited) drops the layers' K/V but keeps done, keys_ and ids:
    # the next sequence's first chunks are never offloaded, and its later ones
    # are keyed with the old sequence's tokens.
    a, b = _ids(16, seed=8), _ids(24, seed=9)
    cache = KvtierCache(model.config, "dram:16MiB", codec="raw", chunk_tokens=CHUNK)
    with torch.inference_mode():
        cache.track(a)
        model(a, past_key_values=cache, use_cache=True)
        cache.reset()
        cache.track(b)
        model(b, past_key_values=cache, use_cache=True)
    assert cache.stored == 2 + 3 and cache.done == 24
    again = KvtierCache(model.config, cache.tiers, codec="raw", chunk_tokens=CHUNK)
    assert again.restore(torch.cat([a, b[:, :8]], 1)) == 16  # not 24: b[0:8] after a is unseen
    cache.close()


def test_an_fp16_payload_in_shared_tiers_does_not_break_a_bf16_forward(model) -> None:
    # The fingerprint says bf16 for every model (ModelDesc(dtype="bf16")), so an
    # fp16 run's payloads sit under the keys a bf16 run computes; _offload's
    # put is then a no-op, get returns the fp16 payload and _install's decode
    # raises KVT_ESHAPE out of the model's forward (it is outside the try).
    a = _ids(16, seed=8)
    fp16 = KvtierCache(model.config, "dram:16MiB", codec="k16v8", chunk_tokens=CHUNK)
    try:
        with torch.inference_mode():
            fp16.track(a)
            model.to(torch.float16)(a, past_key_values=fp16, use_cache=True)
    finally:
        model.to(torch.bfloat16)  # the module's model
    bf16 = KvtierCache(model.config, fp16.tiers, codec="k16v8", chunk_tokens=CHUNK)
    bf16.track(a)
    with torch.inference_mode():
        model(a, past_key_values=bf16, use_cache=True)
    fp16.close()


def test_quality_refuses_a_prefix_without_a_full_chunk(model) -> None:
    # measure() with P < chunk sends nothing through the codec and reports
    # int4 as perfect (B/elem 0, dNLL 0, top-1 1, KL 0).
    import numpy as np

    from kvtier import quality

    toks = np.asarray(_ids(80)[0])
    with pytest.raises((SystemExit, ValueError)):
        quality.measure(model, toks, codecs=["int4"], prefixes=[20], score=8, windows=1,
                        chunk=32, variants=["kv"], generate=0, dram="16MiB")


def test_a_forward_that_builds_a_graph_is_refused(model) -> None:
    # The cache rewrites past K/V in place, which autograd cannot follow.
    cache = KvtierCache(model.config, "dram:16MiB", chunk_tokens=CHUNK)
    with pytest.raises(ValueError, match="no_grad"):
        model(_ids(4), past_key_values=cache, use_cache=True)
    cache.close()


@pytest.mark.parametrize("argv, says", [
    (["--codecs", "nope"], "--codecs"),
    (["--chunk", "0"], "--chunk"),
    (["--score", "1"], "--score"),
    (["--prefix", "100", "--chunk", "256"], "shorter than a chunk"),
    (["--model", "/nonexistent/model.gguf"], "no such file"),
    (["--variants", "kx"], "--variants"),
])
def test_quality_refuses_bad_options_before_loading_a_model(argv, says, capsys) -> None:
    from kvtier import quality

    with pytest.raises(SystemExit) as e:
        quality.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_quality_window_statistics_and_json(model, tmp_path: Path) -> None:
    # +-SEw comes from the window means: with two windows of equal size the
    # token mean is the mean of the window means and SEw = |w1 - w2| / 2.
    import json
    import math

    import numpy as np

    from kvtier import quality

    toks = np.asarray(_ids(200)[0])
    rows, ppl = quality.measure(model, toks, codecs=["int4"], prefixes=[32], score=16,
                                windows=2, chunk=CHUNK, variants=["kv"], generate=0,
                                dram="16MiB")
    (r,) = rows
    assert len(r.window_dnll) == 2 and r.tokens == 32
    assert math.isclose(sum(r.window_dnll) / 2, r.dnll, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(r.dnll_se_win, abs(r.window_dnll[0] - r.window_dnll[1]) / 2,
                        rel_tol=1e-9, abs_tol=1e-12)
    # one window: no SEw; the JSON says null, never NaN
    rows1, _ = quality.measure(model, toks, codecs=["int4"], prefixes=[32], score=16,
                               windows=1, chunk=CHUNK, variants=["kv"], generate=0,
                               dram="16MiB")
    assert math.isnan(rows1[0].dnll_se_win)
    doc = quality._no_nan({"rows": [quality.asdict(rows1[0])], "x": [float("nan")]})
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text)["rows"][0]["dnll_se_win"] is None


def test_quality_refuses_overlapping_windows(model) -> None:
    # 4 windows of 32 + 16 + 1 tokens in 60 tokens would score tokens twice.
    import numpy as np

    from kvtier import quality

    with pytest.raises(ValueError, match="overlap"):
        quality.measure(model, np.asarray(_ids(60)[0]), codecs=["int4"], prefixes=[32],
                        score=16, windows=4, chunk=CHUNK, variants=["kv"], generate=0,
                        dram="16MiB")


@pytest.mark.parametrize("text, codecs", [
    ("raw,k16v8", ["raw", "k16v8"]),
    ("int4,int4,group=64,int4,kgroup=dim", ["int4", "int4,group=64", "int4,kgroup=dim"]),
    ("k=i4,v=i4,group=16,k16v8", ["k=i4,v=i4,group=16", "k16v8"]),
])
def test_quality_codec_lists_keep_each_specs_options(text, codecs) -> None:
    # A plain split on commas cut "int4,group=64" into "int4" and "group=64".
    from kvtier import quality

    assert quality.split_codecs(text) == codecs
