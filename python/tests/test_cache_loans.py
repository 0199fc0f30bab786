"""Cache.borrow / Loan lifetimes under misuse (from the issue-18 review).
Each runs its case in a
child interpreter, since the defects are a crash and a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import threading, time, numpy as np, kvtier
MODEL = kvtier.ModelDesc("rev18", layers=2, kv_heads=2, head_dim=32, dtype="fp16")
FP = kvtier.fingerprint(MODEL, "k16v8")
(key,) = kvtier.chunk_keys(FP, np.arange(16, dtype=np.uint32), 16)
k = np.ones((2, 16, 2, 32), np.float16)
payload = kvtier.encode(k, k, "k16v8", key=key, fingerprint=FP)
cache = kvtier.Cache("dram:4MiB", fingerprint=FP, chunk_tokens=16)
cache.put(key, payload)
"""


def _child(body: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=timeout, env=os.environ)


def test_a_loan_array_kept_past_cache_close_does_not_crash_python() -> None:
    """Was a SIGSEGV at 8c95c7b: Cache.close() returns the loans still out and
    closes the tiers; an array the caller still holds then points into
    unmapped slabs, and reading it kills the interpreter."""
    r = _child("""
        with cache:
            arr = cache.borrow(key).array
        print(int(arr.astype(np.uint64).sum()))
    """)
    assert r.returncode == 0, f"child died with {r.returncode}: {r.stderr[-300:]}"


def test_close_returns_loans_even_while_a_delete_waits_for_one() -> None:
    """Was a hang at 8c95c7b: A delete on another thread waits for the loan;
    close() waits for that delete before it returns the loans it promises
    to return, so neither ever ends."""
    r = _child("""
        loan = cache.borrow(key)
        threading.Thread(target=cache.delete, args=(key,), daemon=True).start()
        time.sleep(0.3)
        t = threading.Thread(target=cache.close, daemon=True)
        t.start(); t.join(3)
        print("closed" if not t.is_alive() else "close hangs")
    """)
    assert "closed" in r.stdout, r.stdout + r.stderr[-300:]


def test_a_loan_array_cannot_be_made_writable() -> None:
    r = _child("""
        loan = cache.borrow(key)
        try:
            loan.array.flags.writeable = True
            print("writable")
        except ValueError:
            print("read-only")
        loan.close()
    """)
    assert "read-only" in r.stdout, r.stdout + r.stderr[-300:]


def test_a_reservation_array_kept_past_publish_and_close_does_not_crash_python(tmp_path) -> None:
    """A reservation's array kept after publish(): the cache closes (its
    tiers unmap their slabs) while the array still points into them, and
    using it kills the interpreter, as a kept loan array did at 8c95c7b."""
    r = _child(f"""
        cache.close()
        cache = kvtier.Cache("dram:4MiB", fingerprint=FP, chunk_tokens=16)
        (k2,) = kvtier.chunk_keys(FP, np.arange(16, 32, dtype=np.uint32), 16)
        p2 = kvtier.encode(k, k, "k16v8", key=k2, fingerprint=FP)
        with cache:
            res = cache.reserve(k2, len(p2))
            arr = res.array
            arr[:] = np.frombuffer(p2, np.uint8)
            res.publish()
        print(int(arr.astype(np.uint64).sum()))
    """)
    assert r.returncode == 0, f"child died with {r.returncode}: {r.stderr[-300:]}"


def test_close_with_a_reservation_out_closes_once_it_ends(tmp_path) -> None:
    """close() with a reservation out keeps the tiers (the nvme directory's
    lock) until it is published, aborted or dropped, then lets them go."""
    r = _child(f"""
        cache.close()
        d = "{tmp_path}/n"
        spec = "dram:4MiB;nvme:" + d + ":16MiB"
        for end in ("publish", "abort", "drop"):
            c = kvtier.Cache(spec, fingerprint=FP, chunk_tokens=16, write_through=True)
            res = c.reserve(key, len(payload))
            if res is None:
                c.delete(key); res = c.reserve(key, len(payload))
            res.array[:] = np.frombuffer(payload, np.uint8)
            c.close()
            try:
                kvtier.Cache("nvme:" + d + ":16MiB", fingerprint=FP, chunk_tokens=16).close()
                print(end, "lock released too early")
            except kvtier.Error:
                pass
            if end == "publish":
                res.publish()
            elif end == "abort":
                res.abort()
            else:
                del res
            c2 = kvtier.Cache("nvme:" + d + ":16MiB", fingerprint=FP, chunk_tokens=16)
            print(end, "held" if c2.query(key) else "absent")
            c2.close()
    """)
    assert r.returncode == 0, r.stderr[-500:]
    assert "too early" not in r.stdout, r.stdout
    assert r.stdout.split() == ["publish", "held", "abort", "absent", "drop", "absent"], r.stdout
