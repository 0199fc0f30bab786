"""Shared fixtures of the kvtier binding's tests.

Run from the repository with a built library:
    KVTIER_LIBRARY=build/libkvtier.so.0.3 KVTIER_CLI=build/programs/kvtier \
        python -m pytest python/tests
(ctest's test_python does this; without KVTIER_CLI the tests look for
build/programs/kvtier, then `kvtier` on PATH, and skip what needs the CLI.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, List

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _find_cli() -> str | None:
    env = os.environ.get("KVTIER_CLI")
    if env is not None:  # set, even empty: that one or none
        return env or None
    built = REPO / "build" / "programs" / "kvtier"
    if built.is_file():
        return str(built)
    return shutil.which("kvtier")


@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """Runs the kvtier command-line tool; skips where it is not built."""
    path = _find_cli()
    if not path:
        pytest.skip("no kvtier CLI: set KVTIER_CLI to build/programs/kvtier (ctest sets it)")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            raise AssertionError(f"kvtier {' '.join(map(str, args))}: exit {p.returncode}\n"
                                 f"{p.stdout}{p.stderr}")
        return p

    return run


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20260418)


def kv_arrays(rng: np.random.Generator, shape: tuple, dtype: str) -> List[np.ndarray]:
    """Random K and V of shape in dtype: fp16 as numpy float16, bf16 as the
    uint16 bits (float32 truncated: every pattern a finite bf16)."""
    out = []
    for _ in range(2):
        x = rng.standard_normal(shape, dtype=np.float32) * 2.0
        if dtype == "fp16":
            out.append(x.astype(np.float16))
        else:
            out.append((x.view(np.uint32) >> 16).astype(np.uint16))
    return out


def as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    """Values of fp16 arrays or bf16 bit arrays, as float32."""
    if dtype == "fp16":
        return a.astype(np.float32)
    return (a.astype(np.uint32) << 16).view(np.float32)
