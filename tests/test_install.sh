#!/usr/bin/env bash
# test_install.sh - the installed tree serves an embedder (ctest: test_install).
#
#   tests/test_install.sh BUILD_DIR SOURCE_DIR CC [FLAGS...]     (FLAGS: the build's sanitizer flags, if any)
#
# 1. `cmake --install BUILD_DIR --prefix TMP` puts bin/ppn, include/ppn.h, lib/libppn.so*, lib/libppn.a and
#    lib/pkgconfig/ppn.pc under TMP.
# 2. examples/embed.c builds against TMP with `pkg-config --cflags --libs ppn` (libppn.so) and with
#    `pkg-config --static --libs ppn` (libppn.a); on the sim backend both print the ids `TMP/bin/ppn run` prints
#    for the same tiny model, prompt and count (greedy).
# 3. libppn.so's dynamic symbol table defines exactly the functions ppn.h declares: no internal ppn_*, nothing of
#    jemalloc, liburcu, hwloc or jansson. The declared names come from the compiler (gcc -aux-info), not from
#    cmake/ppn_exports.cmake's regex that wrote the version script, so a miss of that regex fails here.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) cc=$3
shift 3
flags=("$@")
cmake=${CMAKE:-cmake}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ppn-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

# 1. Install -------------------------------------------------------------------------------------------------
# The version comes from ppn.h's PPN_VERSION_*; before 1.0 the SONAME carries major.minor, from 1.0 the major.
ver() { sed -n "s/^#define PPN_VERSION_$1 \([0-9][0-9]*\)\$/\1/p" "$src/include/ppn.h"; }
major=$(ver MAJOR) minor=$(ver MINOR) patch=$(ver PATCH)
[ -n "$major" ] && [ -n "$minor" ] && [ -n "$patch" ] || fail "include/ppn.h has no PPN_VERSION_MAJOR/MINOR/PATCH"
if [ "$major" = 0 ]; then want_so=libppn.so.0.$minor; else want_so=libppn.so.$major; fi
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in bin/ppn include/ppn.h lib/libppn.so "lib/$want_so" lib/libppn.a lib/pkgconfig/ppn.pc; do
    [ -e "$prefix/$f" ] || fail "$f was not installed"
done
soname=$(readelf -d "$prefix/lib/libppn.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "$want_so" ] || fail "SONAME is '$soname', not $want_so (ppn.h's version $major.$minor.$patch)"
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

# 2. Build the example against the installed tree, run it, compare with the CLI ------------------------------
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cflags=$(pkg-config --cflags ppn) || fail "pkg-config --cflags ppn"
libs=$(pkg-config --libs ppn) || fail "pkg-config --libs ppn"
static_libs=$(pkg-config --static --libs ppn) || fail "pkg-config --static --libs ppn"
[ "$(pkg-config --modversion ppn)" = "$major.$minor.$patch" ] || fail "ppn.pc's version is not $major.$minor.$patch (ppn.h)"
static_libs=${static_libs/-lppn /-l:libppn.a }   # the same flags, with the archive named (libppn.so sits beside it)
echo "pkg-config: --cflags '$cflags' --libs '$libs' --static --libs '$static_libs'"
warn=(-std=c11 -Wall -Wextra -Werror)
# Word splitting of the pkg-config output is intended.
# shellcheck disable=SC2086
"$cc" "${flags[@]}" "${warn[@]}" -o "$tmp/embed" "$src/examples/embed.c" $cflags $libs || fail "embed (shared) does not build"
# shellcheck disable=SC2086
"$cc" "${flags[@]}" "${warn[@]}" -o "$tmp/embed_static" "$src/examples/embed.c" $cflags $static_libs ||
    fail "embed (static) does not link with pkg-config --static --libs"
readelf -d "$tmp/embed" | grep NEEDED | grep -qF "[$want_so]" || fail "embed does not load $want_so"
! readelf -d "$tmp/embed_static" | grep -q 'NEEDED.*libppn' || fail "embed_static loads libppn.so"

export PPN_BACKEND=sim
model=$tmp/tiny ids=1,300,401 n=8
"$prefix/bin/ppn" mkmodel --shape tiny --out "$model" >/dev/null || fail "ppn mkmodel"
want=$("$prefix/bin/ppn" run --model "$model" --ids $ids -n $n --quiet) || fail "ppn run"
got=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/embed" "$model" $ids $n) || fail "embed (libppn.so) failed"
got_static=$("$tmp/embed_static" "$model" $ids $n) || fail "embed (libppn.a) failed"
echo "ppn run:              $want"
echo "embed (libppn.so):    $got"
echo "embed (libppn.a):     $got_static"
[ -n "$want" ] && [ "$(tr -cd , <<<"$want" | wc -c)" -eq $((n - 1)) ] || fail "ppn run printed '$want', not $n ids"
[ "$got" = "$want" ] || fail "embed through libppn.so printed '$got', ppn run '$want'"
[ "$got_static" = "$want" ] || fail "embed through libppn.a printed '$got_static', ppn run '$want'"

# 3. Exactly ppn.h's functions exported -----------------------------------------------------------------------
# -aux-info writes one prototype a line, "/* FILE:LINE:NC */ extern TYPE NAME (ARGS);", for every function the
# translation unit declares; the first "NAME (" of a line from ppn.h is the function's name.
"$cc" -fsyntax-only -aux-info "$tmp/aux.txt" -x c "$prefix/include/ppn.h" ||
    fail "$cc -aux-info could not read ppn.h's declarations"
grep -F "$prefix/include/ppn.h:" "$tmp/aux.txt" | grep -v '\*/ static ' |
    sed -E 's@^/\*[^*]*\*/ *@@; s@^([^(]*[^A-Za-z0-9_(])([A-Za-z_][A-Za-z0-9_]*) \(.*@\2@' | sort -u >"$tmp/declared"
nm -D --defined-only "$prefix/lib/libppn.so" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/exported"
n_decl=$(wc -l <"$tmp/declared")
n_exp=$(wc -l <"$tmp/exported")
echo "ppn.h declares $n_decl functions; libppn.so defines $n_exp dynamic symbols"
[ "$n_decl" -gt 0 ] || fail "no declarations read from ppn.h"
if ! diff "$tmp/declared" "$tmp/exported" >"$tmp/diff"; then
    sed -n 's/^< /  declared, not exported: /p; s/^> /  exported, not declared: /p' "$tmp/diff" >&2
    fail "libppn.so's exports differ from ppn.h's functions"
fi
echo "test_install: ok"
