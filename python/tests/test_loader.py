"""Loading the library: version, struct layouts against the C compiler, the
error names, and what happens when the library cannot be found."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import kvtier
from kvtier import _structs

INCLUDE = Path(os.environ.get("KVTIER_INCLUDE", REPO / "include"))


def test_library_version_matches_the_package() -> None:
    assert kvtier.__version__ == "0.3.3"
    assert kvtier.library_version.split(".")[:2] == kvtier.__version__.split(".")[:2]
    assert Path(kvtier.library_path).name.startswith("libkvtier.so") or \
        kvtier.library_path.startswith("libkvtier.so")


@pytest.mark.skipif(not os.environ.get("KVTIER_EXPECT_BUNDLED"),
                    reason="run_pytest.sh (ctest) checks the installed package's bundled library")
def test_an_installed_package_loads_its_bundled_library() -> None:
    bundled = Path(kvtier.__file__).parent / "_lib" / kvtier._loader.SONAME
    assert kvtier.library_path == str(bundled) and bundled.is_file()
    assert (Path(kvtier.__file__).parent / "py.typed").is_file()
    assert "KVTIER_LIBRARY" not in os.environ


def test_every_mirrored_struct_has_the_c_size_and_offsets(tmp_path: Path) -> None:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc or not (INCLUDE / "kvtier.h").is_file():
        pytest.skip("needs a C compiler and include/kvtier.h (KVTIER_INCLUDE)")
    lines = []
    for name, cls in _structs.MIRRORED.items():
        lines.append(f'  printf("%s . %zu\\n", "{name}", sizeof({name}));')
        for field, *_ in cls._fields_:
            lines.append(f'  printf("%s {field} %zu\\n", "{name}", offsetof({name}, {field}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <kvtier.h>\n"
                   "int main(void) {\n" + "\n".join(lines) + "\n  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    mismatches = []
    for line in out.splitlines():
        name, field, value = line.split()
        cls = _structs.MIRRORED[name]
        ours = ctypes.sizeof(cls) if field == "." else getattr(cls, field).offset
        if ours != int(value):
            mismatches.append(f"{name}.{field}: C {value}, ctypes {ours}")
    assert not mismatches, mismatches


def test_the_library_reports_the_sizes_the_binding_mirrors() -> None:
    reported = kvtier._loader._reported_sizes(kvtier._loader.lib)
    assert set(reported) >= {"kvt_kv_view", "kvt_model_arch", "kvt_codec_spec",
                             "kvt_payload_info", "kvt_section_info"}
    for name, size in reported.items():
        assert size == ctypes.sizeof(_structs.MIRRORED[name]), name


def test_error_codes_have_the_c_names() -> None:
    for code in kvtier.ErrorCode:
        assert kvtier.err_name(code) == f"KVT_{code.name}"
        e = kvtier.Error(code)
        assert (e.code, e.name) == (int(code), f"KVT_{code.name}")
        assert str(e) == f"KVT_{code.name}: {kvtier.strerror(code)}"
    assert kvtier.err_name(-12) == "ENOMEM"


def _import_with(env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", "import kvtier"], env=full,
                          capture_output=True, text=True, timeout=60)


def test_a_kvtier_library_that_does_not_load_fails_the_import(tmp_path: Path) -> None:
    p = _import_with({"KVTIER_LIBRARY": str(tmp_path / "missing.so")})
    assert p.returncode != 0
    assert "KVTIER_LIBRARY" in p.stderr and "ImportError" in p.stderr


def test_a_library_of_another_version_fails_the_import(tmp_path: Path) -> None:
    # A library exporting the API's names with another kvt_version().
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        pytest.skip("needs a C compiler")
    names = [n for n in kvtier._loader._PROTOTYPES if n not in ("kvt_version",
                                                                "kvt_version_string")]
    src = tmp_path / "fake.c"
    src.write_text("".join(f"void {n}(void) {{}}\n" for n in names)
                   + "unsigned kvt_version(void) { return 401; }\n"
                   + 'const char *kvt_version_string(void) { return "0.4.1"; }\n')
    lib = tmp_path / "libfake.so"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    p = _import_with({"KVTIER_LIBRARY": str(lib)})
    assert p.returncode != 0 and "0.4.1" in p.stderr and "major.minor" in p.stderr
