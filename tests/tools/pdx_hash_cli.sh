#!/bin/sh
# pdx-hash on the vectors (seed "0", block 4) and on bad input.
# Usage: pdx_hash_cli.sh <path to pdx-hash>
set -u
bin=$1
fail=0

check() { # name expected actual
    if [ "$2" != "$3" ]; then
        printf 'FAIL %s\n--- expected\n%s\n--- got\n%s\n' "$1" "$2" "$3"
        fail=1
    fi
}

expect='none 1ebe36576dcb573f26b99533a20aaeca
block 0 0a8577df5ee3430515a8cc1f6e3ac52e
block 1 d152782cb4d753bde718a811a3b75e23
tail 7157acec76700e416a50d67e2334f6f6'
got=$(printf '1 2 3 4\n5\t6 7 8  9 10\n' |
      "$bin" --algo xxhash_cbor --seed 0 --block-size 4 --tail)
check "xxhash vectors" "$expect" "$got"

# Without --tail there is no tail line; seed 42's NONE_HASH.
got=$(printf '' | "$bin" --algo xxhash_cbor --seed 42 --block-size 4 --tail)
check "seed 42" "none a9d2e63407fce1a26c9dc9d7fa2d7caf" "$got"
got=$(echo 1 2 3 4 5 6 7 8 9 10 |
      "$bin" --algo xxhash_cbor --seed 0 --block-size 4 | tail -n 1)
check "no --tail" "block 1 d152782cb4d753bde718a811a3b75e23" "$got"

# sha256_cbor (values from gen_vectors.py).
got=$(echo 1 2 3 4 5 6 7 8 9 10 |
      "$bin" --algo sha256_cbor --seed 0 --block-size 4 --tail | tail -n 1)
check "sha256 tail" \
    "tail 128a226d31d49c070c027325a6f501ea097fb252653e92d2055ff7af74062fc8" \
    "$got"

# Extra keys: LoRA and salt, and no tail with them.
expect='none 1ebe36576dcb573f26b99533a20aaeca
block 0 547f61f138b524115af11d03df1f589b
block 1 8e532ec09a17468f10633ac9175c1185'
got=$(echo 1 2 3 4 5 6 7 8 9 10 |
      "$bin" --algo xxhash_cbor --seed 0 --block-size 4 --tail \
             --lora my-lora --salt s1)
check "lora+salt" "$expect" "$got"

# 2^64-1 is a valid token.
got=$(echo 23 24 255 256 65535 65536 4294967295 4294967296 \
           18446744073709551615 0 1 18446744073709551614 |
      "$bin" --algo xxhash_cbor --seed 0 --block-size 4 | tail -n 1)
check "big ids" "block 2 268f1159a14524705e3f3fa226c4ff33" "$got"

# Bad input: exit 2 and a message naming the problem.
bad() { # name stdin expected-substring args...
    name=$1 in=$2 want=$3
    shift 3
    err=$(printf '%s' "$in" | "$bin" "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 2 ]; then
        printf 'FAIL %s: exit %d, want 2 (%s)\n' "$name" $rc "$err"
        fail=1
    fi
    case $err in
    *"$want"*) ;;
    *)
        printf 'FAIL %s: message "%s" lacks "%s"\n' "$name" "$err" "$want"
        fail=1
        ;;
    esac
}
ok="--algo xxhash_cbor --seed 0 --block-size 4"
bad "overflow" "18446744073709551616" "18446744073709551616" $ok
bad "negative" "1 -2" "-2" $ok
bad "junk" "1 2x" "2x" $ok
bad "algo" "1" "nope" --algo nope --seed 0 --block-size 4
bad "no seed" "1" "--seed" --algo xxhash_cbor --block-size 4
bad "block size" "1" "block size" --algo xxhash_cbor --seed 0 --block-size 0
bad "block size junk" "1" "4k" --algo xxhash_cbor --seed 0 --block-size 4k
bad "unknown option" "1" "--frob" $ok --frob

[ $fail -eq 0 ] && echo "pdx-hash cli: ok"
exit $fail
