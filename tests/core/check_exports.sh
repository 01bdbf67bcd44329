#!/bin/sh
# Fails when libpdx.so exports a symbol outside the pdx_ namespace.
set -eu
lib="$1"
syms=$(nm -D --defined-only "$lib" | awk '{print $3}')
[ -n "$syms" ] || { echo "no exported symbols in $lib"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^pdx_' || true)
if [ -n "$bad" ]; then
    echo "non-pdx_ exports in $lib:"; printf '%s\n' "$bad"; exit 1
fi
printf '%s\n' "$syms" | grep -qx pdx_plugin_v1 || { echo "pdx_plugin_v1 missing"; exit 1; }
echo "exports ok: $(printf '%s\n' "$syms" | wc -l) pdx_ symbols"
