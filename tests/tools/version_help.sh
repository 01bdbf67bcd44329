#!/bin/sh
# Every tool answers --version (its name, its version and libpdx.so's) and
# a complete --help on stdout with exit 0: usage, every option named below,
# --version itself. Arguments: the tools' paths, pdx-info first, then
# pdx-hash, pdx-bench, pdx-validate, glm52-pd-node.
set -u
fail=0
check() { # tool, then words its --help must contain
    t="$1"; shift
    name=$(basename "$t")
    v=$("$t" --version 2>&1); rc=$?
    case "$v" in
        "$name "[0-9]*"(libpdx.so "*) ;;
        *) echo "$name --version: '$v'"; fail=1 ;;
    esac
    [ $rc -eq 0 ] || { echo "$name --version: exit $rc"; fail=1; }
    h=$("$t" --help 2>/dev/null); rc=$?
    [ $rc -eq 0 ] || { echo "$name --help: exit $rc"; fail=1; }
    for w in "usage: $name" --version "$@"; do
        printf '%s' "$h" | grep -q -e "$w" || {
            echo "$name --help lacks '$w'"; fail=1; }
    done
}
check "$1" --blob --stats PDX_PLUGIN_PATH
check "$2" --algo --seed --block-size --tail --lora --salt
check "$3" --quick --json --plot --tls --path --sizes --reps idle latency \
    transfer handoff hash offload
check "$4" --p-config --d-config --sessions --soak --multi-node --json
check "$5" --config --fd --job-timeout
[ $fail -eq 0 ] && echo "version and help ok"
exit $fail
