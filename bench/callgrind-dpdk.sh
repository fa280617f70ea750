#!/usr/bin/env bash
# Instructions per frame on qswitch's worker under the DPDK load (qsload, the default load of
# `qswitch bench pvp`): runs `qswitch run` (one worker, two vhost-user server ports) under
# callgrind, drives it with qsload for a few seconds per frame size, and divides
#  - the inclusive instructions of the vhost-user port's rx_burst + tx_burst, and
#  - everything the worker thread executed (poll loop, lookup, sleeps included)
# by the frames the switch moved (port b's tx counter). The simulated caches (--cache-sim)
# give D1 and last-level misses per frame; the worker's sleeps and wake-ups per frame come
# from its counters. Deterministic where `bench pvp`'s Mpps are noisy; valgrind makes the
# worker ~50x slower, so the rings stay full and bursts are whole.
# The simulated caches are given explicitly: valgrind sizes its last-level cache from CPUID,
# which this project's VMs (PVM) report wrongly (a 256 MiB direct-mapped LL whose misses
# meant nothing). D1 and LL default to this machine's L1d and L3 as sysfs reports them;
# LL=L2 simulates the core's private L2 as the last level instead (where the worker's own
# buffers should stay), LL=size,assoc,line any other cache.
# Usage: [SIZES="64 1518"] [POOLS=1|2] [LL=L3|L2|size,assoc,line] [KEEP=1]
#        bench/callgrind-dpdk.sh [QSWITCH_BINARY]
#        POOLS: qsload's load shape (1: one pool of 8191 mbufs, default; 2: transmit and
#        receive pools of 16383, the larger working set `bench pvp` also measures)
#        (default binary: target/release/qswitch)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
bin=$(realpath "${1:-target/release/qswitch}")
# A cache of this machine as valgrind's size,assoc,line: index 0 (or 1) of cpu0 is L1d.
cache() {
    local d=/sys/devices/system/cpu/cpu0/cache/index$1 size
    size=$(sed 's/K$//' "$d/size")
    echo "$((size * 1024)),$(cat "$d/ways_of_associativity"),$(cat "$d/coherency_line_size")"
}
d1=$(cache 0 2>/dev/null || echo 32768,8,64)
case "${LL:-L3}" in
L3) ll=$(cache 3 2>/dev/null || echo 33554432,16,64) ;;
L2) ll=$(cache 2 2>/dev/null || echo 1048576,8,64) ;;
*) ll=$LL ;;
esac
echo "simulated caches: D1 $d1, LL $ll (size,assoc,line)"
dir=$(mktemp -d /tmp/qswitch-cg-dpdk-XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "/var/run/dpdk/qscg$$"
    # KEEP=1 keeps the profiles and logs for a closer look (callgrind_annotate).
    if [ -n "${KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
cc -O2 bench/dpdk-load/qsload.c $(pkg-config --cflags --libs libdpdk) -o "$dir/qsload"
for size in ${SIZES:-64 1518}; do
    len=$((size - 4))
    cat >"$dir/q.toml" <<EOF
[switch]
workers = "1"
control = "$dir/control.sock"

[[port]]
name = "a"
type = "vhost-user"
socket = "$dir/a.sock"
mode = "server"

[[port]]
name = "b"
type = "vhost-user"
socket = "$dir/b.sock"
mode = "server"
EOF
    rm -f "$dir"/cg.* "$dir"/*.sock
    valgrind --tool=callgrind --separate-threads=yes --cache-sim=yes --D1="$d1" --LL="$ll" \
        --callgrind-out-file="$dir/cg.%p" "$bin" run --config "$dir/q.toml" >"$dir/qswitch.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do [ -S "$dir/b.sock" ] && break; sleep 0.1; done
    "$dir/qsload" --no-huge -m 1024 --no-pci --iova-mode=va --file-prefix "qscg$$" -l 0 \
        --vdev "net_virtio_user0,path=$dir/a.sock,queues=1" \
        --vdev "net_virtio_user1,path=$dir/b.sock,queues=1" \
        -- --size "$len" --pools "${POOLS:-1}" --seconds 4 --warmup 1 --link-timeout 60 >"$dir/qsload.json" 2>"$dir/qsload.log" || true
    stats=$("$bin" stats --json --control "$dir/control.sock")
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
    echo "== $size B"
    python3 - "$dir" "$stats" <<'EOF'
import glob, json, re, subprocess, sys
d, stats = sys.argv[1], json.loads(sys.argv[2])
frames = next(p for p in stats["ports"] if p["name"] == "b")["tx_packets"]
w = stats["workers"][0]
worker = None
for f in sorted(glob.glob(d + "/cg.*")):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", f],
                         capture_output=True, text=True).stdout
    # The worker is the thread that receives: of the threads that call an rx_burst, the one
    # that executed the most (its run loop may be inlined into the thread's entry, so its
    # name is not a reliable mark).
    total = re.search(r"^([\d,]+) \(", next((l for l in out.splitlines() if l.endswith("PROGRAM TOTALS")), "0 ("))
    ir = int(total.group(1).replace(",", "")) if total else 0
    if re.search(r"::rx_burst( \[|$)", out, re.M) and (worker is None or ir > worker[2]):
        worker = (f, out, ir)
if not worker:
    sys.exit("no worker thread in the profiles")
f, out, _ = worker
events = re.search(r"^Events shown:\s+(.*)$", out, re.M).group(1).split()
line = next(l for l in out.splitlines() if l.endswith("PROGRAM TOTALS"))
totals = re.findall(r"([\d,]+) \(", line)
tot = {e: int(v.replace(",", "")) for e, v in zip(events, totals)}
ports = subprocess.run(["python3", "bench/cg_per_frame.py", f], capture_output=True, text=True).stdout
burst = 0
for m in re.finditer(r"::(rx|tx)_burst: \d+ calls, (\d+) instructions inclusive", ports):
    burst += int(m.group(2))
per = lambda k: tot.get(k, 0) / frames
print(f"frames moved: {frames}")
print(f"instructions per frame, vhost-user rx_burst + tx_burst: {burst / frames:.1f}")
print(f"instructions per frame, whole worker thread: {per('Ir'):.1f}")
print(f"D1 misses per frame (reads + writes, simulated): {per('D1mr') + per('D1mw'):.2f}")
print(f"last-level misses per frame (simulated): {per('DLmr') + per('DLmw'):.2f}")
print(f"worker sleeps per 1000 frames: {1000 * w.get('sleeps', 0) / frames:.3f}")
EOF
done
