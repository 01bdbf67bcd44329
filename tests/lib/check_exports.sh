#!/bin/sh
# Fails when libpdx.so exports a symbol outside the pdx_ namespace, or
# (with the version script as second argument) when a name it lists is not
# exported: a listed function renamed or left without PDX_API.
set -eu
lib="$1"
map="${2:-}"
syms=$(nm -D --defined-only "$lib" | awk '{print $3}')
[ -n "$syms" ] || { echo "no exported symbols in $lib"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^pdx_' || true)
if [ -n "$bad" ]; then
    echo "non-pdx_ exports in $lib:"; printf '%s\n' "$bad"; exit 1
fi
printf '%s\n' "$syms" | grep -qx pdx_plugin_v1 || { echo "pdx_plugin_v1 missing"; exit 1; }
if [ -n "$map" ]; then
    listed=$(sed -n 's/^ *\(pdx_[a-z0-9_]*\);$/\1/p' "$map")
    missing=$(printf '%s\n' "$listed" | grep -vxF "$syms" || true)
    if [ -n "$missing" ]; then
        echo "listed in $map but not exported:"; printf '%s\n' "$missing"
        exit 1
    fi
fi
echo "exports ok: $(printf '%s\n' "$syms" | wc -l) pdx_ symbols"
