#!/usr/bin/env bash
# A decode config that differs from prefill in one invariant must stop the
# run at connect (pdx-validate exit 3) with an error naming the field.
#   mismatch.sh PDX_VALIDATE CONFIG_DIR seed|layout|block_tokens
set -uo pipefail
validate=$1 cfgdir=$2 kind=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$cfgdir/colocated-decode.json
dst=$tmp/decode-$kind.json
case $kind in
    seed)   # another hashing.seed: another NONE_HASH
        sed -e 's/"seed": *"[^"]*"/"seed": "not-the-prefill-seed"/' "$src" >"$dst"
        want='none_hash|seed' ;;
    layout) # another MLA width: another layout fingerprint
        sed -e 's/"mla_bytes_per_token": *656/"mla_bytes_per_token": 640/' \
            -e '/"bytes_per_block"/d' "$src" >"$dst"
        want='layout_fingerprint|mla_bytes_per_token' ;;
    block_tokens) # another block size
        sed -e 's/"block_tokens": *64/"block_tokens": 32/' \
            -e '/"bytes_per_block"/d' "$src" >"$dst"
        want='block_size|block_tokens' ;;
    *) echo "unknown kind $kind"; exit 2 ;;
esac
if cmp -s "$src" "$dst"; then
    echo "FAIL: could not change $kind in $src (format changed?)"
    exit 1
fi
out=$tmp/out.txt
"$validate" --p-config "$cfgdir/colocated-prefill.json" --d-config "$dst" \
    --sessions 1 --prompts 1200 --quiet --timeout 120 >"$out" 2>&1
rc=$?
cat "$out"
if [ $rc -eq 0 ]; then
    echo "FAIL: pdx-validate passed with a $kind mismatch"
    exit 1
fi
if [ $rc -ne 3 ]; then
    echo "FAIL: pdx-validate exited $rc, not 3 (stopped at connect)"
    exit 1
fi
if ! grep -Eq "connect refused:.*($want)" "$out"; then
    echo "FAIL: no 'connect refused' error naming the field ($want)"
    exit 1
fi
echo "ok: $kind mismatch refused at connect (exit $rc)"
