#!/usr/bin/env bash
# Instructions (and, with --cache, cache misses) per frame of the firewall's verdict: runs
# each deterministic case of crates/dp/benches/firewall.rs under callgrind, counting only
# its `measure` function (100 000 frames), and prints the totals per frame. The cache
# simulation takes a 32 MiB last-level cache (callgrind would take the host's, which on
# this machine holds the whole 1 M-session table), 16-way, 64-byte lines.
# Usage: bench/cg_firewall.sh [--cache] [BENCH_BINARY] [CASE...]
set -euo pipefail
cd "$(dirname "$0")/.."
cache=(--cache-sim=no)
if [ "${1:-}" = --cache ]; then cache=(--cache-sim=yes --LL=33554432,16,64); shift; fi
bin=${1:-}
if [ -z "$bin" ]; then
    bin=$(cargo bench --profile release -p qswitch-dp --bench firewall --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "firewall" and m.get("executable"):
        print(m["executable"])')
else
    shift
fi
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(parse est_1k est_1m est_1m_burst new_1 new_50)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for c in "${cases[@]}"; do
    QSWITCH_FW_CASE=$c valgrind --tool=callgrind "${cache[@]}" --toggle-collect='*firewall::measure*' \
        --callgrind-out-file="$out/cg.$c" "$bin" >/dev/null 2>"$out/log.$c"
    python3 - "$out/cg.$c" "$c" <<'PY'
import sys
events, totals = None, None
for line in open(sys.argv[1]):
    if line.startswith("events:"):
        events = line.split()[1:]
    elif line.startswith("totals:") or line.startswith("summary:"):
        totals = [int(x) for x in line.split()[1:]]
totals += [0] * (len(events) - len(totals))  # callgrind leaves trailing zeros out
per = {e: t / 100_000 for e, t in zip(events, totals)}
text = f"Ir {per['Ir']:.1f}"
if "D1mr" in per:
    d1 = per["D1mr"] + per["D1mw"]
    ll = per["DLmr"] + per["DLmw"]
    text += f"  D1 misses {d1:.2f}  LL misses {ll:.2f}"
print(f"{sys.argv[2]:<14} per frame: {text}")
PY
done
