"""Tags the wheel for the platform when kvtier/_lib/ holds a bundled libkvtier
(py3-none-<platform>: a ctypes binding needs no particular Python ABI); a
pure-Python wheel otherwise. Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel

BUNDLED = any((Path(__file__).parent / "kvtier" / "_lib").glob("libkvtier.so.*"))


class _Wheel(bdist_wheel):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = not BUNDLED

    def get_tag(self) -> tuple:
        python, abi, plat = super().get_tag()
        return ("py3", "none", plat) if BUNDLED else (python, abi, plat)


setup(cmdclass={"bdist_wheel": _Wheel})
