#!/bin/sh
# tests/abi/check_symbols.sh - fails when libkvtier.so exports a symbol that
# tests/abi/libkvtier.symbols does not list, or lacks one it lists, naming
# each difference. Every dynamic symbol the library defines counts (functions
# and data, nm -D --defined-only), with no exceptions; docs/API.md says why
# the list is the same in every build.
# Usage: check_symbols.sh NM LIBRARY LIST   (exits 77 when nm is missing)
nm_tool=$1 lib=$2 list=$3
if [ -z "$nm_tool" ] || ! command -v "$nm_tool" >/dev/null 2>&1; then
  echo "no nm: cannot list the exported symbols" >&2
  exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
"$nm_tool" -D --defined-only "$lib" > "$tmp/nm" || { echo "nm failed on $lib" >&2; exit 1; }
awk 'NF >= 2 { print $NF }' "$tmp/nm" | LC_ALL=C sort -u > "$tmp/got"
grep -v '^[[:space:]]*\(#\|$\)' "$list" | LC_ALL=C sort -u > "$tmp/want"
LC_ALL=C comm -23 "$tmp/got" "$tmp/want" > "$tmp/extra"
LC_ALL=C comm -13 "$tmp/got" "$tmp/want" > "$tmp/missing"
status=0
if [ -s "$tmp/extra" ]; then
  echo "$lib exports symbols that $list does not list (make them static or hidden, or list them):"
  sed 's/^/  + /' "$tmp/extra"
  status=1
fi
if [ -s "$tmp/missing" ]; then
  echo "$lib does not export symbols that $list lists (removed or renamed API?):"
  sed 's/^/  - /' "$tmp/missing"
  status=1
fi
[ $status -eq 0 ] && echo "$lib exports exactly the $(wc -l < "$tmp/want") symbols of $list"
exit $status
