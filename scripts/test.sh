#!/usr/bin/env bash
# Builds pdx and runs every test (ctest). Modes:
#   ./scripts/test.sh            normal build (-Werror), all tests
#   ./scripts/test.sh --asan     also an ASan+UBSan build and run
#   ./scripts/test.sh --valgrind also the core tests under valgrind
#   ./scripts/test.sh --tsan     also the thread-contract tests under TSan
#   ./scripts/test.sh --builds   also a Release build with gcc and a
#                                default-type build with clang (no tests)
#   ./scripts/test.sh --ci       what CI runs: all of the above
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
asan=0 vg=0 tsan=0 builds=0
for a in "$@"; do
    case "$a" in
        --asan) asan=1 ;;
        --valgrind) vg=1 ;;
        --tsan) tsan=1 ;;
        --builds) builds=1 ;;
        --ci) asan=1 vg=1 tsan=1 builds=1 ;;
        *) echo "usage: $0 [--asan] [--valgrind] [--tsan] [--builds] [--ci]"; exit 2 ;;
    esac
done
[ $vg = 1 ] && export PDX_WITH_CHECK_TOOLS=1
[ $asan = 1 ] && export PDX_WITH_CHECK_TOOLS=1
[ $builds = 1 ] && export PDX_WITH_CHECK_TOOLS=1
bash scripts/deps.sh
# deps.sh installed every package a test needs: a test that would skip for
# a missing one fails instead, so a skip never hides a test that did not run.
export PDX_TEST_REQUIRE_DEPS=1
jobs=$(nproc 2>/dev/null || echo 2)
# Tests talk over loopback only: keep UCX off every other interface.
export UCX_NET_DEVICES=lo

build_and_test() { # dir, extra cmake args...
    local dir=$1; shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDX_WERROR=ON \
        "$@" >/dev/null
    cmake --build "$dir" -j "$jobs"
    (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 900)
}

echo "== build and test (normal)"
build_and_test build
if [ $builds = 1 ]; then
    # What users and packagers build: warnings are errors here (not by
    # default), so a compiler or optimiser that warns differently shows up.
    echo "== Release build (gcc, -Werror)"
    CC=gcc cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release \
        -DPDX_WERROR=ON >/dev/null
    cmake --build build-release -j "$jobs"
    echo "== default build (clang, -Werror)"
    CC=clang cmake -S . -B build-clang -DPDX_WERROR=ON >/dev/null
    cmake --build build-clang -j "$jobs"
fi
if [ $asan = 1 ]; then
    echo "== build and test (ASan + UBSan)"
    # UCX's own allocations trip LeakSanitizer; pdx leaks are caught by the
    # valgrind pass instead.
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        build_and_test build-asan -DPDX_ASAN=ON -DPDX_UBSAN=ON
fi
if [ $tsan = 1 ]; then
    echo "== ThreadSanitizer (thread-contract tests)"
    cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DPDX_TSAN=ON \
        -DPDX_WERROR=ON >/dev/null
    tsan_tests=(test_threads test_kv_offload test_backend_cma test_api)
    cmake --build build-tsan -j "$jobs" --target "${tsan_tests[@]}"
    for t in "${tsan_tests[@]}"; do
        TSAN_OPTIONS=halt_on_error=1:suppressions=$PWD/scripts/tsan.supp build-tsan/bin/$t >build-tsan/$t.log 2>&1 \
            || { cat build-tsan/$t.log; echo "tsan: $t failed"; exit 1; }
        echo "tsan: $t clean"
    done
    # Two processes over shared memory: the cma worker and the caller in
    # pdx_xfer_check copy halves of the same pieces. --fit keeps every
    # case's descriptors disjoint (overlapping ones write identical bytes
    # from two threads by design). UCX_MEM_EVENTS=no: UCX's madvise hook
    # crashes inside TSan's interceptors when a thread exits.
    cmake --build build-tsan -j "$jobs" --target twoproc pdx_backend_ucx \
        pdx_backend_cma
    UCX_NET_DEVICES=lo UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1:suppressions=$PWD/scripts/tsan.supp \
        timeout 900 build-tsan/bin/twoproc --tls sm --cma --shm --fit \
        >build-tsan/twoproc.log 2>&1 \
        || { cat build-tsan/twoproc.log; echo "tsan: twoproc --shm failed"; exit 1; }
    grep -q "ThreadSanitizer" build-tsan/twoproc.log \
        && { cat build-tsan/twoproc.log; echo "tsan: twoproc --shm reported"; exit 1; }
    echo "tsan: twoproc --cma --shm clean"
    # The etcd store module, the agent's store glue and the connector's
    # owner registry (threads of their own: the pool's save worker reports
    # evictions to the registry thread); their tests fork store clients,
    # hence die_after_fork=0.
    cmake --build build-tsan -j "$jobs" --target test_store_etcd \
        test_store_agent test_store_registry pdx_store_etcd pdx_backend_ucx
    for t in test_store_etcd test_store_agent test_store_registry; do
        UCX_NET_DEVICES=lo UCX_MEM_EVENTS=no \
        TSAN_OPTIONS=halt_on_error=1:die_after_fork=0:suppressions=$PWD/scripts/tsan.supp \
            timeout 600 build-tsan/bin/$t >build-tsan/$t.log 2>&1 \
            || { cat build-tsan/$t.log; echo "tsan: $t failed"; exit 1; }
        echo "tsan: $t clean"
    done
fi
if [ $vg = 1 ]; then
    echo "== valgrind (core tests)"
    for t in test_core test_threads test_api test_kv_hash test_kv_layout test_kv_offload test_kv_config; do
        [ -x build/bin/$t ] || continue
        valgrind -q --error-exitcode=1 --leak-check=full \
            --errors-for-leak-kinds=definite,indirect \
            build/bin/$t >/dev/null 2>build/valgrind-$t.log \
            || { cat build/valgrind-$t.log; echo "valgrind: $t failed"; exit 1; }
        echo "valgrind: $t clean"
    done
fi
echo "all tests passed"
