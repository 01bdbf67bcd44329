#!/usr/bin/env bash
# Runs each libFuzzer harness (blob, config, params, peer_load) for a given time with
# clang, ASan and UBSan, on a scratch copy of its seed corpus. Usage:
#   ./scripts/fuzz.sh [SECONDS_PER_FUZZER] [NAME...]     (default 600, all)
# A crash leaves its input in build-fuzz/ and makes the script exit 1;
# add such inputs to tests/fuzz/corpus/<name>/ once fixed, so CI replays them.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(blob config params peer_load)
# peer_load drives real UCX endpoints: loopback only, and UCX's own
# allocations are not leaks of pdx (valgrind covers those).
export UCX_NET_DEVICES=lo PDX_LOG_LEVEL=${PDX_LOG_LEVEL:-error}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
PDX_WITH_CHECK_TOOLS=1 bash scripts/deps.sh
CC=clang cmake -S . -B build-fuzz -DPDX_FUZZ=ON -DPDX_WERROR=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
for n in "${names[@]}"; do targets+=("fuzz_$n"); done
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}" >/dev/null
rc=0
for n in "${names[@]}"; do
    work=$(mktemp -d)
    cp tests/fuzz/corpus/$n/* "$work"/ 2>/dev/null || true
    dict=()
    [ -f tests/fuzz/$n.dict ] && dict=(-dict=tests/fuzz/$n.dict)
    echo "== fuzz_$n for ${secs}s"
    if (cd build-fuzz && ./bin/fuzz_$n -max_total_time="$secs" \
            -print_final_stats=1 "${dict[@]/#-dict=/-dict=../}" "$work" \
            >"fuzz_$n.log" 2>&1); then
        grep -E "stat::number_of_executed_units" "build-fuzz/fuzz_$n.log" || true
    else
        echo "fuzz_$n: crash or error, see build-fuzz/fuzz_$n.log"; rc=1
    fi
    rm -rf "$work"
done
exit $rc
