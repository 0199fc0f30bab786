"""The README's Python example runs as written."""

from __future__ import annotations

import re

import pytest
from conftest import REPO


def test_the_readme_python_example_runs(capsys) -> None:
    readme = REPO / "README.md"
    if not readme.is_file():
        pytest.skip("README.md is not beside python/")
    section = readme.read_text().split("## Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.split("\n")
    assert out[0] == "k16v8" and out[1] == "1 None"
