#!/usr/bin/env bash
# Installs a built pdx into a fresh prefix and uses it the ways users do:
# a C program built with pkg-config and one built with find_package(pdx),
# each loading its backends from the installed module directory, and the
# installed tools. install_test.sh BUILD_DIR SOURCE_DIR [SANITIZER_FLAGS]
set -euo pipefail
build=$1 src=$2 san=${3:-}
work=$(mktemp -d /tmp/pdx-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/pdx/pdx.h include/pdx/kv_connector.h lib/libpdx.so \
         lib/pdx/libpdx_backend_ucx.so lib/pdx/libpdx_backend_cma.so \
         lib/pdx/libpdx_store_etcd.so lib/pkgconfig/pdx.pc \
         lib/cmake/pdx/pdxConfig.cmake bin/pdx-info bin/pdx-validate \
         bin/pdx-bench share/pdx/configs/glm52-fp8-mtp/prefill.json; do
    [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
# Every public header is installed and compiles on its own (one header per
# object: each includes what it needs).
for h in "$src"/include/pdx/*.h; do
    f=include/pdx/$(basename "$h")
    [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
    printf '#include <pdx/%s>\n' "$(basename "$h")" |
        cc -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" \
            -x c - || { echo "FAIL: $f does not compile alone"; exit 1; }
done
[ ! -e "$prefix/include/pdx/README.md" ] ||
    { echo "FAIL: include/pdx/README.md installed"; exit 1; }
soname=$(readelf -d "$prefix/lib/libpdx.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libpdx.so.0 ] || { echo "FAIL: SONAME '$soname'"; exit 1; }
# Nothing may find the build tree: no plugin path, no library path.
unset PDX_PLUGIN_PATH LD_LIBRARY_PATH

echo "== pkg-config"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# As the README says, nothing more: pdx.pc carries the run path, so the
# program starts from a prefix outside the loader's paths.
cc -std=c11 -Wall -Werror $san $(pkg-config --cflags pdx) \
    "$src/tests/lib/install/consumer/main.c" -o "$work/consumer-pc" \
    $(pkg-config --libs pdx)
"$work/consumer-pc" "$prefix/"

echo "== find_package(pdx)"
cmake -S "$src/tests/lib/install/consumer" -B "$work/cb" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$san" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" >/dev/null
cmake --build "$work/cb" >/dev/null
"$work/cb/consumer" "$prefix/"

echo "== installed tools"
out=$("$prefix/bin/pdx-info" 2>&1) || { echo "$out"; echo "FAIL: pdx-info"; exit 1; }
echo "$out" | grep -q "ucx: available" || { echo "$out"; echo "FAIL: pdx-info"; exit 1; }
echo "$out" | head -4
echo "install test passed"
