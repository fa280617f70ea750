#!/bin/bash
# One TCP flow (iperf3, 6 s) through a 4-queue veth uplink (afxdp native) to a TAP, started
# before the idle queues coalesce: prints Gbit/s, where each queue ended up and the moves.
# Root; QSWITCH=path to the binary (default ./target/release/qswitch). Namespaces mqpeer,
# mqvm and the veth qmU/qmP are made and removed.
set -u
B=${QSWITCH:-./target/release/qswitch}
D=/tmp/mqtest; rm -rf $D; mkdir -p $D
ip netns add mqpeer; ip netns add mqvm
ip link add qmU numtxqueues 4 numrxqueues 4 type veth peer name qmP numtxqueues 4 numrxqueues 4
ip link set qmP netns mqpeer
ip -n mqpeer addr add 10.96.0.1/24 dev qmP; ip -n mqpeer link set qmP up; ip -n mqpeer link set lo up
ip netns exec mqpeer ethtool -K qmP tx off tso off gso off >/dev/null
ethtool -K qmU gro off >/dev/null 2>&1; ip link set qmU up
cat > $D/c.toml <<T
[switch]
workers = "0-1"
control = "$D/c.sock"
[[port]]
name = "up"
type = "afxdp"
ifname = "qmU"
mode = "native"
queues = 4
[[port]]
name = "vm"
type = "tap"
ifname = "qmT"
T
$B run --config $D/c.toml > $D/log 2>&1 &
QP=$!
for i in $(seq 50); do ip link show qmT >/dev/null 2>&1 && break; sleep 0.1; done
ip link set qmT netns mqvm; ip -n mqvm addr add 10.96.0.2/24 dev qmT; ip -n mqvm link set qmT up; ip -n mqvm link set lo up
sleep 0.1

ip netns exec mqvm iperf3 -s -1 -B 10.96.0.2 >/dev/null 2>&1 &
sleep 0.5
ip netns exec mqpeer iperf3 -c 10.96.0.2 -t 6 | grep -E "sender|receiver"
$B placement --control $D/c.sock --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print([(q["port"],q["queue"],q["worker"],q["state"],round(q["load"],2)) for q in d["queues"]]); print([m["reason"][:60] for m in d["moves"]])'
kill $QP; wait $QP
ip netns del mqpeer; ip netns del mqvm; ip link del qmU 2>/dev/null
grep -i "panic" $D/log; rm -rf $D
