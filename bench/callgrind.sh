#!/usr/bin/env bash
# Instructions per frame of the vhost-user port code (the deterministic complement of
# `qswitch bench pvp`): runs the `vhost_path` criterion bench under callgrind for a few seconds
# per frame size and divides the inclusive instructions of the port's rx_burst + tx_burst by
# the frames they moved. Usage: bench/callgrind.sh [BENCH_BINARY]  (default: builds it)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
bin=${1:-}
if [ -z "$bin" ]; then
    bin=$(cargo bench -p qswitch-dp --bench vhost_path --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "vhost_path" and m.get("executable"):
        print(m["executable"])')
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for len in 60 1514; do
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$len" "$bin" --bench --profile-time 3 \
        "vhost_path/a_to_b/$len" >/dev/null 2>&1
    echo "== $len B"
    python3 bench/cg_per_frame.py "$out/cg.$len"
done
