#!/usr/bin/env bash
# tests/install/check.sh BUILD_DIR [SANITIZE] - install kvtier from BUILD_DIR into a
# temporary prefix, then build and run consumers through find_package
# (shared and static) and through pkg-config.
set -euo pipefail
build=$1
case "${2:-OFF}" in
  ON | on | 1 | TRUE | true)
    echo "skipped: a sanitizer build's libraries need the sanitizer runtime in every consumer"
    exit 77
    ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$here" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer/consumer_shared"
"$tmp/consumer/consumer_static"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
cc "$here/consumer.c" $(pkg-config --cflags --libs kvtier) -o "$tmp/pc"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc"
echo "install check: find_package (shared, static) and pkg-config consumers ran"
