#!/usr/bin/env bash
# Installs the Debian packages pdx needs, only those missing. Sourced or run
# by demo.sh and test.sh; needs root (or sudo) when something is missing.
set -euo pipefail
PDX_DEPS=(cmake make gcc pkg-config libucx-dev ucx-utils libxxhash-dev
          libcjson-dev libcmocka-dev libssl-dev
          libcurl4-openssl-dev libnghttp2-dev etcd-server etcd-client iproute2
          python3-dev python3-numpy python3-pytest python3-pip python3-setuptools python3-venv
          python3-torch libmicrohttpd-dev prometheus python3-prometheus-client
          gnuplot-nox)
if [ "${PDX_WITH_CHECK_TOOLS:-0}" = 1 ]; then
    PDX_DEPS+=(valgrind clang libclang-rt-14-dev python3-cbor2 python3-xxhash)
fi
missing=()
for p in "${PDX_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
        || { $SUDO apt-get update >/dev/null && \
             $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
    # The tests run prometheus's binary on loopback ports of their own;
    # Debian's package also starts a system server on :9090 where systemd
    # runs. One this script just installed is stopped and disabled, not
    # left listening on every interface.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl \
           >/dev/null && systemctl is-enabled --quiet prometheus 2>/dev/null; then
        if $SUDO systemctl disable --now prometheus >/dev/null 2>&1; then
            echo "deps: stopped and disabled the prometheus service just installed (the tests need only its binary)"
        fi
    fi
fi
