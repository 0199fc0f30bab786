"""Marks the wheel platform-specific when kvtier/_lib/ holds a bundled
libkvtier (a pure-Python wheel otherwise); everything else is in
pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution


class _Dist(Distribution):
    def has_ext_modules(self) -> bool:
        return any((Path(__file__).parent / "kvtier" / "_lib").glob("libkvtier.so.*"))


setup(distclass=_Dist)
