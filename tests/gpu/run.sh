#!/bin/bash
# One prepared run of the cuda_ipc checks on a machine with an NVIDIA GPU,
# CMake, gcc and the CUDA toolkit, but none of pdx's other dependencies and
# no network: they come from the Debian packages in tests/gpu/debs/ (see
# prepare-debs.sh), unpacked into build-gpu/prefix.
#
# Steps: report the machine; stop with exit 3 if there is no GPU driver;
# unpack the .debs (dpkg-deb, else ar+tar, else python3) and point
# pkg-config at them; build the cuda_ipc targets; run the cuda_ipc ctest part
# (unit tests, the fake-driver two-process run, and the module's real-GPU
# conformance); run tests/gpu/cuda_ipc_gpu_test (two processes, 1 GiB of
# GLM-5.2-shaped arenas, byte-exact READ/WRITE, bandwidth table), then again
# with all arenas in one allocation; then VRAM over UCX with cuda_ipc off,
# staged through pinned host memory, and natively when PDX_UCX_CUDA_PREFIX
# names a UCX built with CUDA.
#
# Environment: MIB (default 1024), JOBS (default nproc), PDX_GPU_BUILD
# (default <repo>/build-gpu), OUT (logs are copied there when set),
# PDX_UCX_CUDA_PREFIX (a UCX built with CUDA: its lib/ is put first).
# Dry run on a machine without a GPU: PDX_RUN_WITH_FAKE_DRIVER=1 uses the
# fake driver of tests/fixtures instead (MIB defaults to 64 then);
# PDX_USE_BUNDLED_PKGCONF=1 uses the unpacked pkgconf even if pkg-config
# exists.
# Exit: 0 all passed; 1 a check failed; 2 CUDA IPC between processes is
# refused here; 3 no GPU / cannot build.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${PDX_GPU_BUILD:-$ROOT/build-gpu}
PFX=$B/prefix
BLD=$B/build
LOGS=$B/logs
FAKE=${PDX_RUN_WITH_FAKE_DRIVER:-0}
if [ "$FAKE" = 1 ]; then MIB=${MIB:-64}; else MIB=${MIB:-1024}; fi
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
mkdir -p "$LOGS"

say() { echo "[run.sh $(date +%H:%M:%S)] $*"; }
save_logs() { if [ -n "${OUT:-}" ]; then cp -r "$LOGS" "$OUT/" 2>/dev/null; fi; }
finish() { save_logs; exit "$1"; }

# ---- 0. the machine -------------------------------------------------------
say "machine: $(uname -srm), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version 2>/dev/null | head -1)"
say "tools: $(cmake --version 2>/dev/null | head -1); $(gcc --version 2>/dev/null | head -1); $(nvcc --version 2>/dev/null | tail -1)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>&1 | sed 's/^/[run.sh] /'
fi

# ---- 1. a GPU driver? -----------------------------------------------------
have_driver=0
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    have_driver=1
fi
for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64 \
         /usr/local/nvidia/lib ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do
    [ -e "$d/libcuda.so.1" ] && have_driver=1
done
if [ "$FAKE" = 1 ]; then
    say "PDX_RUN_WITH_FAKE_DRIVER=1: the fake driver stands in for the GPU"
elif [ "$have_driver" = 0 ]; then
    say "no NVIDIA driver here (libcuda.so.1 not found): this script needs a machine with a GPU"
    finish 3
fi

# ---- 2. dependencies from the .debs ----------------------------------------
shopt -s nullglob
debs=("$ROOT"/tests/gpu/debs/*.deb)
if [ ${#debs[@]} -eq 0 ]; then
    say "tests/gpu/debs/ is empty: run tests/gpu/prepare-debs.sh where apt works, and bring the tree with it"
    finish 3
fi
unpack() { # deb dest
    if command -v dpkg-deb >/dev/null 2>&1; then
        dpkg-deb -x "$1" "$2" && return 0
    fi
    local t
    t=$(mktemp -d)
    if command -v ar >/dev/null 2>&1 && (cd "$t" && ar x "$1") &&
        tar -xf "$t"/data.tar.* -C "$2" 2>/dev/null; then
        rm -rf "$t"
        return 0
    fi
    rm -rf "$t"
    python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n"
off = 8
while off < len(data):
    name = data[off:off + 16].decode().strip().rstrip("/")
    size = int(data[off + 48:off + 58].decode().strip())
    body = data[off + 60:off + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
    off += 60 + size + (size & 1)
PY
}
if [ ! -f "$PFX/.unpacked" ]; then
    rm -rf "$PFX"
    mkdir -p "$PFX"
    for d in "${debs[@]}"; do
        unpack "$d" "$PFX" || { say "cannot unpack $d"; finish 3; }
    done
    # .pc files say /usr: make them say the prefix (forms seen: prefix=/usr,
    # "prefix = /usr", libdir=/usr/..., -L/usr/..., -I/usr/...).
    for pc in "$PFX"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$PFX"/usr/share/pkgconfig/*.pc; do
        sed -E -i "s#(^|[=[:space:]]|-I|-L)/usr(/|[[:space:]]|\$)#\1$PFX/usr\2#g" "$pc"
    done
    touch "$PFX/.unpacked"
    say "unpacked ${#debs[@]} packages into $PFX"
fi
LIBDIR=$PFX/usr/lib/x86_64-linux-gnu
LIBDIRS=$LIBDIR:$PFX/lib/x86_64-linux-gnu
export PKG_CONFIG_LIBDIR=$LIBDIR/pkgconfig:$PFX/usr/share/pkgconfig
export PKG_CONFIG_PATH=$PKG_CONFIG_LIBDIR
PKGCONF=$(command -v pkg-config || true)
[ "${PDX_USE_BUNDLED_PKGCONF:-0}" = 1 ] && PKGCONF=
if [ -z "$PKGCONF" ]; then
    # pkgconf from the .debs, with its library
    PKGCONF=$B/pkg-config
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIBDIRS" \
        "$PFX/usr/bin/pkgconf" >"$PKGCONF"
    chmod +x "$PKGCONF"
fi
for m in ucx libxxhash libcjson cmocka libcrypto; do
    if ! "$PKGCONF" --exists "$m"; then
        say "pkg-config cannot find $m in $PKG_CONFIG_LIBDIR"
        finish 3
    fi
done
say "dependencies: ucx $("$PKGCONF" --modversion ucx), xxhash $("$PKGCONF" --modversion libxxhash), cjson $("$PKGCONF" --modversion libcjson), cmocka $("$PKGCONF" --modversion cmocka), libcrypto $("$PKGCONF" --modversion libcrypto)"

# ---- 3. build ---------------------------------------------------------------
LINK="-Wl,-rpath-link,$LIBDIRS"
say "configuring and building in $BLD (log: $LOGS/build.log)"
if ! cmake -S "$ROOT" -B "$BLD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DPDX_WERROR=OFF -DPKG_CONFIG_EXECUTABLE="$PKGCONF" \
        -DCMAKE_PREFIX_PATH="$PFX/usr" \
        -DCMAKE_EXE_LINKER_FLAGS="$LINK" \
        -DCMAKE_SHARED_LINKER_FLAGS="$LINK" \
        -DCMAKE_MODULE_LINKER_FLAGS="$LINK" >"$LOGS/build.log" 2>&1; then
    tail -30 "$LOGS/build.log"
    say "cmake configure failed"
    finish 3
fi
targets="pdx pdx_backend_cuda_ipc pdx_backend_ucx pdx_fake_cuda
         test_cuda_ipc_wire test_cuda_ipc_fake test_cuda_ipc_module
         cuda_ipc_gpu_test"
# shellcheck disable=SC2086
if ! cmake --build "$BLD" -j "$JOBS" --target $targets >>"$LOGS/build.log" 2>&1; then
    grep -E "error|Error" "$LOGS/build.log" | head -30
    say "build failed"
    finish 3
fi
say "built"

# ---- 4. run -------------------------------------------------------------------
export LD_LIBRARY_PATH=$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$LIBDIR/ucx
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-error}
if [ "$FAKE" = 1 ]; then
    export PDX_CUDA_DRIVER_LIB=$BLD/tests/fixtures/libpdx_fake_cuda.so
fi
rc=0

say "ctest -L cuda_ipc -LE gpu (unit tests, fake-driver two-process run, real-GPU conformance)"
(cd "$BLD" && ctest -L cuda_ipc -LE gpu --output-on-failure -V) >"$LOGS/ctest.log" 2>&1
crc=$?
grep -E "^[0-9]+: \[ *(SKIPPED|FAILED|  PASSED|  OK) *\]|^[0-9]+: cuda_ipc: |tests passed|tests failed|\*\*\*|Passed|Failed" \
    "$LOGS/ctest.log" | sed 's/^/  /' | tail -40
[ $crc -ne 0 ] && { say "ctest failed (see $LOGS/ctest.log)"; rc=1; }

run_gpu() { # name args...
    local name=$1
    shift
    say "cuda_ipc_gpu_test $* (log: $LOGS/$name.log)"
    timeout 480 "$BLD/bin/cuda_ipc_gpu_test" "$@" >"$LOGS/$name.log" 2>&1
    local r=$?
    grep -vE "^\[[pd]\] (device|cuda_ipc|raw)" "$LOGS/$name.log" | tail -40
    return $r
}
run_gpu gpu_arenas --mib "$MIB" --alloc arena
grc=$?
if [ $grc -eq 2 ]; then
    say "CUDA IPC between two processes is refused on this machine (sandbox/container); nothing more to learn here"
    finish 2
fi
[ $grc -ne 0 ] && rc=1
run_gpu gpu_one_alloc --mib $((MIB < 256 ? MIB : 256)) --alloc one --quick
[ $? -ne 0 ] && rc=1

# VRAM over UCX with cuda_ipc off: staged through pinned host memory (the
# path across hosts where UCX has no CUDA), then natively where a UCX built
# with CUDA is supplied (PDX_UCX_CUDA_PREFIX, see backends/ucx/README.md).
run_gpu ucx_staged --mib $((MIB < 256 ? MIB : 256)) --alloc arena \
    --path ucx-staged --ucx-tls tcp
[ $? -ne 0 ] && rc=1
if [ -n "${PDX_UCX_CUDA_PREFIX:-}" ]; then
    (
        export LD_LIBRARY_PATH=$PDX_UCX_CUDA_PREFIX/lib:$LD_LIBRARY_PATH
        export UCX_MODULE_DIR=$PDX_UCX_CUDA_PREFIX/lib/ucx
        run_gpu ucx_native --mib $((MIB < 256 ? MIB : 256)) --alloc arena \
            --path ucx-native --ucx-tls all
    ) || rc=1
else
    say "PDX_UCX_CUDA_PREFIX not set: the native VRAM path over UCX is not run"
fi

if [ $rc -eq 0 ]; then
    say "ALL PASSED"
else
    say "FAILURES (logs in $LOGS${OUT:+, copied to \$OUT})"
fi
finish $rc
