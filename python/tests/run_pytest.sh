#!/usr/bin/env bash
# python/tests/run_pytest.sh LIBRARY SONAME CLI|none SANITIZE - ctest's test_python.
# Installs the package as a user would (pip install, with LIBRARY bundled in
# kvtier/_lib/ as SONAME) into a temporary directory, then runs python/tests
# against that copy, with CLI as the `kvtier` tool for the equality tests.
# Skips (77) where the venv of bootstrap.sh is missing (KVT_VENV, default
# ~/.cache/kvtier/venv-py) and in sanitizer builds (Python would need the
# sanitizer runtime preloaded).
set -euo pipefail
lib=$1 soname=$2 cli=$3 sanitize=${4:-OFF}
[ "$cli" = none ] && cli=""  # the tests that need the CLI skip
case "$sanitize" in
  ON | on | 1 | TRUE | true)
    echo "skipped: a sanitizer build's libkvtier cannot be loaded into Python without its runtime"
    exit 77
    ;;
esac
venv=${KVT_VENV:-${HOME:-/root}/.cache/kvtier/venv-py}
py=$venv/bin/python
if ! [ -x "$py" ] || ! "$py" -c 'import numpy, pytest, setuptools' 2>/dev/null; then
  echo "skipped: no venv with numpy, pytest and setuptools at $venv;" \
       "'./bootstrap.sh test' creates it (python/requirements-test.txt)"
  exit 77
fi
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
cp -r "$src/kvtier" "$src/pyproject.toml" "$src/setup.py" "$src/README.md" "$tmp/src/"
find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$tmp/src/kvtier/_lib/"libkvtier.so*
cp "$lib" "$tmp/src/kvtier/_lib/$soname"
"$py" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site" \
  "$tmp/src" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; exit 1; }
for f in kvtier/py.typed "kvtier/_lib/$soname"; do
  [ -f "$tmp/site/$f" ] || { echo "pip install left out $f"; exit 1; }
done
cd "$tmp"
env -u KVTIER_LIBRARY PYTHONPATH="$tmp/site" PYTHONDONTWRITEBYTECODE=1 KVTIER_CLI="$cli" \
  KVTIER_EXPECT_BUNDLED=1 "$py" -m pytest -q -rs -p no:cacheprovider --basetemp="$tmp/pytest" \
  "$src/tests"
