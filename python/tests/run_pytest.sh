#!/usr/bin/env bash
# python/tests/run_pytest.sh LIBRARY SONAME CLI|none SANITIZE [all|vllm|sglang|lmcache] -
# ctest's test_python, test_vllm, test_sglang and test_lmcache.
# Installs the package as a user would (pip install, with LIBRARY bundled in
# kvtier/_lib/ as SONAME) into a temporary directory, then runs python/tests
# against that copy, with CLI as the `kvtier` tool for the equality tests.
# Skips (77) where the venv of bootstrap.sh is missing (KVT_VENV, default
# ~/.cache/kvtier/venv-py) and in sanitizer builds (Python would need the
# sanitizer runtime preloaded). With "vllm", runs the vLLM plug-in's tests
# (test_vllm_*.py) in the venv of `./bootstrap.sh vllm` (KVT_VLLM_VENV,
# default ~/.cache/kvtier/venv-vllm) instead; with "sglang", the SGLang
# backend's tests (test_sglang_*.py) in the venv of `./bootstrap.sh sglang`
# (KVT_SGLANG_VENV, default ~/.cache/kvtier/venv-sglang); with "lmcache", the
# LMCache plug-in's tests (test_lmcache_*.py) in the venv of `./bootstrap.sh
# lmcache` (KVT_LMCACHE_VENV, default ~/.cache/kvtier/venv-lmcache).
set -euo pipefail
lib=$1 soname=$2 cli=$3 sanitize=${4:-OFF} suite=${5:-all}
[ "$cli" = none ] && cli=""  # the tests that need the CLI skip
case "$sanitize" in
  ON | on | 1 | TRUE | true)
    echo "skipped: a sanitizer build's libkvtier cannot be loaded into Python without its runtime"
    exit 77
    ;;
esac
src=$(cd "$(dirname "$0")/.." && pwd)
targets=("$src/tests")
if [ "$suite" = vllm ]; then
  venv=${KVT_VLLM_VENV:-${HOME:-/root}/.cache/kvtier/venv-vllm}
  need='import numpy, pytest, setuptools, vllm'
  made_by="'./bootstrap.sh vllm' (or 'test') creates it (python/requirements-vllm.txt)"
  targets=("$src"/tests/test_vllm_*.py)
elif [ "$suite" = sglang ]; then
  venv=${KVT_SGLANG_VENV:-${HOME:-/root}/.cache/kvtier/venv-sglang}
  need='import numpy, pytest, setuptools, sglang.srt.mem_cache.hicache_storage'
  made_by="'./bootstrap.sh sglang' (or 'test') creates it (python/requirements-sglang.txt)"
  targets=("$src"/tests/test_sglang_*.py)
elif [ "$suite" = lmcache ]; then
  venv=${KVT_LMCACHE_VENV:-${HOME:-/root}/.cache/kvtier/venv-lmcache}
  need='import numpy, pytest, setuptools, lmcache.v1.storage_backend'
  made_by="'./bootstrap.sh lmcache' (or 'test') creates it (python/requirements-lmcache.txt)"
  targets=("$src"/tests/test_lmcache_*.py)
else
  venv=${KVT_VENV:-${HOME:-/root}/.cache/kvtier/venv-py}
  need='import numpy, pytest, setuptools'
  made_by="'./bootstrap.sh test' creates it (python/requirements-test.txt)"
fi
py=$venv/bin/python
if ! [ -x "$py" ] || ! "$py" -c "$need" 2>/dev/null; then
  echo "skipped: no venv where '$need' works at $venv; $made_by"
  exit 77
fi
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
  "${targets[@]}"
