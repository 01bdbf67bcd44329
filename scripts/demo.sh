#!/usr/bin/env bash
# Builds pdx (build/, RelWithDebInfo) and runs the GLM-5.2 P/D example with
# validation on the colocated configs: sessions of 1200 and 12020 tokens,
# two turns, P -> D handoff, D's decoded blocks reused by P in turn 2, every
# loaded byte checked. Prints the report; exits with pdx-validate's status
# (0 = PASS). Extra arguments go to pdx-validate (e.g. --json, --sessions 8).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
echo "== build (build/, RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs" --target pdx-validate >/dev/null
# P and D talk over loopback shared memory only.
export UCX_NET_DEVICES=lo
cfg=configs/glm52-fp8-mtp
echo "== pdx-validate: $cfg/colocated-prefill.json + colocated-decode.json"
set +e
build/bin/pdx-validate \
    --p-config "$cfg/colocated-prefill.json" \
    --d-config "$cfg/colocated-decode.json" \
    --prompts 1200,12020 --turns 2 --sessions 4 --concurrency 2 "$@"
rc=$?
set -e
exit $rc
