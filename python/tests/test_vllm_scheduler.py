"""The plug-in driven by vLLM 0.33.0's real Scheduler on CPU (vllm_support):
stores become hits, prefixes match as chains, a restarted engine finds its
NVMe payloads, and a corrupt payload is a failed load that vLLM recomputes.
The worker's device is the CPU stand-in for the GPU handle (CpuDevice)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed in this Python; './bootstrap.sh vllm' installs "
    "vLLM 0.33.0 into ${KVT_VLLM_VENV:-~/.cache/kvtier/venv-vllm} and runs these tests "
    "(ctest's test_vllm runs them with that venv)")

import numpy as np  # noqa: E402
from vllm.v1.kv_offload.base import make_offload_key  # noqa: E402

import vllm_support as vs  # noqa: E402

BS = 16  # tokens per block = per chunk


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return vs.write_model_dir(tmp_path / "model")


def prompt(n_blocks: int, seed: int, tail: int = 5) -> list:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(10, 1000, n_blocks * BS + tail)]


def assert_kv_restored(eng: vs.Engine, req, upto: int) -> None:
    """The request's blocks hold what the fake model wrote for its tokens
    (K bit-exact, V within k16v8's 8-bit error)."""
    hd = vs.HEAD_DIM
    for pos in range(upto):
        got = eng.block_kv(req, pos)
        want = np.stack([vs.kv_rows(req.all_token_ids[pos], pos, li) for li in range(vs.LAYERS)])
        np.testing.assert_array_equal(got[..., :hd], want[..., :hd], err_msg=f"K at {pos}")
        as_f = lambda a: (a.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
        np.testing.assert_allclose(as_f(got[..., hd:]), as_f(want[..., hd:]), atol=0.2)


def first_step_tokens(eng: vs.Engine, req) -> int:
    return eng.computed[req.request_id][0]


def test_stored_prompt_is_loaded_by_the_next_request(model_dir, tmp_path) -> None:
    eng = vs.make_engine(model_dir, {"tiers": "dram:64MiB"})
    p = prompt(4, 1)
    eng.add(p)
    eng.run()
    assert len(eng.manager._held) == 4  # the prompt's 4 full blocks, stored
    assert eng.scheduler.reset_prefix_cache()  # the GPU's prefix cache forgets them
    eng.clear_kv()
    before = eng.device().loads
    req = eng.add(p[:4 * BS] + [3, 4, 5, 6, 7, 8])
    eng.run()
    assert eng.device().loads - before == 4
    assert first_step_tokens(eng, req) == 6  # 64 tokens loaded, the rest computed
    assert_kv_restored(eng, req, 4 * BS)
    eng.shutdown()


def test_prefix_hits_stop_at_the_first_different_block(model_dir) -> None:
    eng = vs.make_engine(model_dir, {"tiers": "dram:64MiB"})
    p = prompt(4, 2)
    eng.add(p)
    eng.run()
    assert eng.scheduler.reset_prefix_cache()
    eng.clear_kv()
    q = p[:2 * BS] + prompt(2, 3, tail=0) + [9, 9]  # blocks 0-1 shared, 2-3 not
    r = p[:BS] + [11] + p[BS + 1:]  # block 1 differs by one token: 2-3 are other chains
    req_q, req_r = eng.add(q), eng.add(r)
    eng.run()
    assert first_step_tokens(eng, req_q) == len(q) - 2 * BS
    assert first_step_tokens(eng, req_r) == len(r) - BS
    assert_kv_restored(eng, req_q, 2 * BS)
    assert_kv_restored(eng, req_r, BS)
    eng.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_restarted_engine_finds_its_nvme_payloads(model_dir, tmp_path, async_scheduling) -> None:
    tiers = {"tiers": f"dram:4MiB;nvme:{tmp_path}/nvme:64MiB"}
    eng = vs.make_engine(model_dir, tiers, async_scheduling=async_scheduling)
    p = prompt(3, 4)
    eng.add(p)
    eng.run()
    eng.shutdown()

    # a new scheduler, worker and cache
    eng = vs.make_engine(model_dir, tiers, async_scheduling=async_scheduling)
    assert not eng.manager._held
    req = eng.add(p + [1, 2])
    out = eng.step()
    assert req.request_id not in out.num_scheduled_tokens  # waits for the workers' answer
    eng.run()
    assert eng.device().loads == 3
    assert first_step_tokens(eng, req) == len(p) + 2 - 3 * BS
    assert_kv_restored(eng, req, 3 * BS)
    eng.shutdown()


def _corrupt(root: Path, key) -> None:
    """Flips a byte inside the sections of the nvme tier's file of key."""
    (f,) = [f for f in root.rglob(key.hex()) if f.is_file()]
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40  # past the header block, inside the sections
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_corrupt_payload_is_a_failed_load_that_vllm_recomputes(model_dir, tmp_path,
                                                               async_scheduling) -> None:
    tiers = {"tiers": f"nvme:{tmp_path}/nvme:64MiB", "codec": "raw"}
    eng = vs.make_engine(model_dir, tiers, async_scheduling=async_scheduling)
    p = prompt(2, 5)
    req = eng.add(p)
    eng.run()
    second = eng.kv_worker.key(make_offload_key(req.block_hashes[1], 0))
    eng.shutdown()
    _corrupt(tmp_path / "nvme", second)

    eng = vs.make_engine(model_dir, tiers, async_scheduling=async_scheduling)
    req = eng.add(p + [1])
    eng.run()
    # The nvme tier checks a hash of the whole payload on every read; the
    # corrupt one is deleted and read as a miss: the load failed at block 1.
    assert eng.kv_worker.stats.reasons == {"KVT_ENOTFOUND": 1}
    assert eng.kv_worker.stats.failed_loads == 1
    # vLLM recomputed the request (failed_recving: from token 0), loading
    # block 0 again and computing the rest.
    assert eng.computed[req.request_id][0] == len(p) + 1 - BS
    assert vs.finished(req)
    assert_kv_restored(eng, req, len(p))  # loaded or recomputed, never the corrupt bytes
    eng.shutdown()

    # The recomputed block was stored again, whole: the next engine loads both.
    eng = vs.make_engine(model_dir, tiers, async_scheduling=async_scheduling)
    req = eng.add(p + [1])
    eng.run()
    assert eng.device().loads == 2 and eng.kv_worker.stats.failed_loads == 0
    assert first_step_tokens(eng, req) == len(p) + 1 - 2 * BS
    assert_kv_restored(eng, req, 2 * BS)
    eng.shutdown()
