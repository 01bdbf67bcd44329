#!/bin/sh
# Download the Debian packages tests/gpu/run.sh needs on a GPU machine that
# has CMake, gcc and the CUDA toolkit but not UCX, xxHash, cJSON, cmocka,
# OpenSSL headers or pkg-config, and cannot download anything.
#
# Run it here, on a Debian 12 (bookworm) machine with apt access. The .debs
# land in tests/gpu/debs/, which is deliberately neither committed nor
# git-ignored: the device tool copies untracked, non-ignored files along
# with the tree, so they travel to the GPU machine without entering history.
# Re-running replaces them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/debs"
pkgs="libucx0 libucx-dev libxxhash0 libxxhash-dev libcjson1 libcjson-dev
      libcmocka0 libcmocka-dev libssl3 libssl-dev
      libnuma1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
      pkgconf pkgconf-bin libpkgconf3"
# libnuma1..libnl-route-3-200: runtime dependencies of libucx0 (its IB and
# RDMA-CM modules; UCX skips those modules when they cannot load).
# pkgconf*: pkg-config, in case the GPU machine lacks it.
mkdir -p "$dest"
rm -f "$dest"/*.deb
cd "$dest"
# shellcheck disable=SC2086
apt-get download $pkgs
ls -l "$dest"
echo "prepare-debs: $(ls "$dest"/*.deb | wc -l) packages in $dest"
