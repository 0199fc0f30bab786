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
