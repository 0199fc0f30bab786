"""The cache through the binding: DRAM, NVMe (restart, demotion, a damaged
file), Redis where redis-server is installed, lookups, errors, threads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import numpy as np
import pytest

import kvtier
from kvtier import ErrorCode

CHUNK = 16
MODEL = kvtier.ModelDesc("py-cache-test", layers=2, kv_heads=2, head_dim=32, dtype="fp16")
FP = kvtier.fingerprint(MODEL, "k16v8")


def _chunks(n: int, seed: int = 1) -> Tuple[np.ndarray, List[kvtier.Key], List[bytes]]:
    """Token ids of n chunks, their keys, and their payloads."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50000, n * CHUNK, dtype=np.uint32)
    keys = kvtier.chunk_keys(FP, tokens, CHUNK)
    payloads = []
    for i, key in enumerate(keys):
        k = rng.standard_normal((2, CHUNK, 2, 32), dtype=np.float32).astype(np.float16)
        payloads.append(kvtier.encode(k, k, "k16v8", key=key, fingerprint=FP,
                                      token_begin=i * CHUNK))
    return tokens, keys, payloads


def _fill(cache: kvtier.Cache, keys: List[kvtier.Key], payloads: List[bytes]) -> None:
    prev = None
    for key, p in zip(keys, payloads):
        cache.put(key, p, prev=prev)
        prev = key


def test_dram_put_get_query_delete_and_stats() -> None:
    tokens, keys, payloads = _chunks(3)
    with kvtier.Cache("dram:4MiB", fingerprint=FP, chunk_tokens=CHUNK) as cache:
        assert cache.tiers == ["dram:4MiB"] and cache.fingerprint == FP
        _fill(cache, keys, payloads)
        assert cache.get(keys[1]) == payloads[1]
        buf = bytearray(len(payloads[2]) + 100)
        assert cache.get_into(keys[2], buf) == len(payloads[2])
        assert bytes(buf[: len(payloads[2])]) == payloads[2]
        assert cache.query(keys[0]) == (len(payloads[0]), 0)
        assert keys[0] in cache and cache.where(keys[0]) == [0]
        assert cache.delete(keys[0]) and not cache.delete(keys[0])
        assert cache.get(keys[0]) is None and keys[0] not in cache
        s = cache.stats()
        assert (s.items, s.puts, s.hits) == (2, 3, 2)
        assert s.bytes_in == sum(map(len, payloads)) and s.used >= sum(map(len, payloads[1:]))
        assert s.gets == 3 and s.misses == 1
        assert cache.stats(0).hits == 2
    assert cache.closed
    with pytest.raises(ValueError, match="closed"):
        cache.get(keys[1])
    cache.close()  # twice is fine


def test_borrow_lends_the_tiers_own_bytes_until_returned(tmp_path: Path, caplog) -> None:
    tokens, keys, payloads = _chunks(3)
    with kvtier.Cache(f"dram:4MiB;nvme:{tmp_path}/n:16MiB", fingerprint=FP, chunk_tokens=CHUNK,
                      promote=False) as cache:
        _fill(cache, keys, payloads)
        with cache.borrow(keys[1]) as loan:
            assert isinstance(loan, kvtier.Loan) and loan.tier == 0
            assert loan.array.tobytes() == payloads[1] and len(loan) == len(payloads[1])
            assert not loan.array.flags.writeable
            assert cache.stats().pinned >= 1
            # A delete waits until the loan is given back; the bytes stay put.
            deleter = threading.Thread(target=cache.delete, args=(keys[1],))
            deleter.start()
            deleter.join(0.2)
            assert deleter.is_alive() and loan.array.tobytes() == payloads[1]
        deleter.join(10)
        assert not deleter.is_alive() and keys[1] not in cache
        assert cache.stats().pinned == 0 and len(loan.array) == 0
        assert cache.borrow(keys[1]) is None  # a miss
        # The nvme tier cannot lend: KVT_ENOTSUP, and get_into still serves it.
        nv = kvtier.Cache(f"nvme:{tmp_path}/only:16MiB", fingerprint=FP, chunk_tokens=CHUNK)
        nv.put(keys[0], payloads[0])
        with pytest.raises(kvtier.Error) as e:
            nv.borrow(keys[0])
        assert e.value.code == ErrorCode.ENOTSUP
        assert nv.get(keys[0]) == payloads[0]
        nv.close()
        # A loan dropped without close() goes back once nothing references it;
        # its array keeps it alive until then.
        arr = cache.borrow(keys[2]).array
        assert cache.stats().pinned >= 1 and arr.tobytes() == payloads[2]
        del arr
        assert cache.stats().pinned == 0
        # A loan still out when the cache closes keeps its tiers open until it is
        # returned, with a warning.
        kept = cache.borrow(keys[0])
    assert "1 loans and 0 reservations out" in caplog.text
    kept.close()  # after the cache closed: nothing to do


def test_get_many_returns_hits_and_misses_in_order() -> None:
    _, keys, payloads = _chunks(4)
    with kvtier.Cache("dram:4MiB", fingerprint=FP) as cache:
        _fill(cache, keys[:3], payloads[:3])
        got = cache.get_many([keys[2], keys[3], keys[0], keys[2]])
        assert got == [payloads[2], None, payloads[0], payloads[2]]
        bufs = [bytearray(len(payloads[0])), bytearray(8)]
        res = cache.get_many_into([keys[0], keys[1]], bufs)
        assert res[0].ok and res[0].length == len(payloads[0]) and res[0].tier == 0
        assert bytes(bufs[0]) == payloads[0]
        assert res[1].code == ErrorCode.ENOBUFS and res[1].length == len(payloads[1])


def test_lookup_counts_the_cached_prefix() -> None:
    tokens, keys, payloads = _chunks(4)
    with kvtier.Cache("dram:4MiB", fingerprint=FP, chunk_tokens=CHUNK) as cache:
        _fill(cache, keys[:2], payloads[:2])
        assert cache.lookup(tokens) == 2 * CHUNK
        assert cache.lookup(tokens[:CHUNK + 5]) == CHUNK
        assert cache.lookup_keys(keys) == 2
        cache.put(keys[3], payloads[3], prev=keys[2])  # unreachable without chunk 2
        assert cache.lookup(tokens) == 2 * CHUNK
        assert cache.stats().lookups >= 2
        plan = cache.plan_restore(tokens, "llama-3.1-8b")
        assert plan.cached_tokens == 2 * CHUNK and plan.tier_bytes[0] > 0
        assert plan.recompute_s > 0


def test_lookup_without_a_fingerprint_is_an_error() -> None:
    with kvtier.Cache("dram:1MiB") as cache:
        with pytest.raises(kvtier.Error) as e:
            cache.lookup([1, 2, 3])
        assert e.value.name == "EINVAL"


def test_foreign_and_malformed_payloads_are_refused() -> None:
    _, keys, payloads = _chunks(2)
    with kvtier.Cache("dram:1MiB", fingerprint=FP) as cache:
        with pytest.raises(kvtier.Error) as e:
            cache.put(keys[0], payloads[1])  # the header names another key
        assert e.value.code == ErrorCode.EFOREIGN and e.value.name == "KVT_EFOREIGN"
        other = kvtier.fingerprint(MODEL, "raw")
        k = np.zeros((2, CHUNK, 2, 32), np.float16)
        theirs = kvtier.encode(k, k, "raw", key=keys[0], fingerprint=other)
        with pytest.raises(kvtier.Error) as e:
            cache.put(keys[0], theirs)
        assert e.value.code == ErrorCode.EFOREIGN
        with pytest.raises(kvtier.Error) as e:
            cache.put(keys[0], b"\0" * 512)
        assert e.value.code == ErrorCode.EFORMAT
        assert cache.stats().items == 0


def test_bad_tier_spec_fails_the_open_with_detail() -> None:
    with pytest.raises(kvtier.Error) as e:
        kvtier.Cache("dram:lots")
    assert e.value.code in (-22, ErrorCode.ESPEC) and e.value.detail


def test_nvme_survives_a_restart(tmp_path: Path) -> None:
    tokens, keys, payloads = _chunks(3)
    spec = f"nvme:{tmp_path}:16MiB"
    with kvtier.Cache(f"dram:1MiB;{spec}", fingerprint=FP, chunk_tokens=CHUNK,
                      write_through=True) as cache:
        _fill(cache, keys, payloads)
        assert cache.where(keys[0]) == [0, 1]
    with kvtier.Cache(spec, fingerprint=FP, chunk_tokens=CHUNK) as cache:
        assert cache.stats().items == 3
        assert cache.lookup(tokens) == 3 * CHUNK
        assert cache.get_many(keys) == payloads


def test_a_small_dram_tier_demotes_to_nvme_and_promotes_back(tmp_path: Path) -> None:
    _, keys, payloads = _chunks(8)
    size = len(payloads[0])
    with kvtier.Cache(f"dram:{3 * size + 512}B;nvme:{tmp_path}:16MiB", fingerprint=FP) as cache:
        for key, p in zip(keys, payloads):  # no prev: unrelated chunks, any may be demoted
            cache.put(key, p)
        assert cache.stats(0).demotions >= 5
        assert cache.where(keys[0]) == [1]
        assert cache.get(keys[0]) == payloads[0]
        assert 0 in cache.where(keys[0])  # promoted
        assert (cache.stats(1).hits, cache.stats(0).promotions) == (1, 1)


def test_a_damaged_nvme_file_is_logged_and_a_miss(tmp_path: Path, caplog) -> None:
    _, keys, payloads = _chunks(1)
    spec = f"nvme:{tmp_path}:16MiB"
    with kvtier.Cache(spec, fingerprint=FP) as cache:
        cache.put(keys[0], payloads[0])
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size >= len(payloads[0])]
    assert len(files) == 1, list(tmp_path.rglob("*"))
    data = bytearray(files[0].read_bytes())
    data[4096 + len(payloads[0]) // 2] ^= 0x40  # in the payload, after the file's header block
    files[0].write_bytes(bytes(data))
    with kvtier.Cache(spec, fingerprint=FP) as cache:
        assert keys[0] in cache
        with caplog.at_level("WARNING", logger="kvtier"):
            assert cache.get(keys[0]) is None  # never wrong bytes
        assert "checksum" in caplog.text and keys[0].hex() in caplog.text
        assert keys[0] not in cache


def test_threads_share_one_cache() -> None:
    _, keys, payloads = _chunks(16)
    errors: List[BaseException] = []
    with kvtier.Cache("dram:8MiB", fingerprint=FP) as cache:
        def work(i: int) -> None:
            try:
                for _ in range(20):
                    for j in range(i, len(keys), 4):
                        cache.put(keys[j], payloads[j])
                        assert cache.get(keys[j]) == payloads[j]
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert cache.stats().items == 16


# --- redis --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server is not installed (apt-get install redis-server; "
                    "bootstrap.sh installs it)")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not _ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server on port {port} did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}?ns=pytest"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_is_shared_between_two_caches(redis_url: str) -> None:
    tokens, keys, payloads = _chunks(3)
    try:
        prefill = kvtier.Cache(redis_url, fingerprint=FP, chunk_tokens=CHUNK)
    except kvtier.Error as e:
        if e.code == ErrorCode.ENOTSUP:
            pytest.skip("library built without the redis tier (libhiredis-dev)")
        raise
    with prefill, kvtier.Cache(f"dram:1MiB;{redis_url}", fingerprint=FP,
                               chunk_tokens=CHUNK) as decode:
        _fill(prefill, keys, payloads)
        assert keys[1] not in decode  # not in its index: asked of the shared tier
        assert decode.get(keys[1]) == payloads[1]
        assert decode.get_many(keys) == payloads
        assert decode.lookup(tokens) == 3 * CHUNK
        assert prefill.stats().items == 3


def test_reserve_then_publish_stores_without_a_copy(tmp_path: Path) -> None:
    _, keys, payloads = _chunks(3, seed=7)
    with kvtier.Cache(f"dram:4MiB;nvme:{tmp_path}/n:16MiB", fingerprint=FP, chunk_tokens=CHUNK,
                      write_through=True) as cache:
        with cache.reserve(keys[0], len(payloads[0])) as r:
            assert isinstance(r, kvtier.Reservation) and len(r) == len(payloads[0])
            r.array[:] = np.frombuffer(payloads[0], np.uint8)
            assert cache.get(keys[0]) is None  # not yet published
            r.publish()
        assert cache.get(keys[0]) == payloads[0] and cache.where(keys[0]) == [0, 1]
        assert cache.reserve(keys[0], len(payloads[0])) is None  # held already
        with pytest.raises(ValueError, match="already"):
            r.publish()
        # Chained, and a refused publish (another chunk's bytes) stores nothing.
        r = cache.reserve(keys[1], len(payloads[1]), prev=keys[0])
        r.array[:] = np.frombuffer(payloads[2], np.uint8)[:len(payloads[1])]
        with pytest.raises(kvtier.Error) as e:
            r.publish()
        assert e.value.code == ErrorCode.EFOREIGN and keys[1] not in cache
        # Aborted (or dropped) reservations give the room back.
        with cache.reserve(keys[1], len(payloads[1]), prev=keys[0]):
            pass
        cache.reserve(keys[2], len(payloads[2]))
        assert keys[1] not in cache
        s = cache.stats(0)
        assert s.items == 1 and s.puts == 1
    nv = kvtier.Cache(f"nvme:{tmp_path}/only:16MiB", fingerprint=FP, chunk_tokens=CHUNK)
    with pytest.raises(kvtier.Error) as e:
        nv.reserve(keys[0], len(payloads[0]))
    assert e.value.code == ErrorCode.ENOTSUP
    nv.close()
