#!/usr/bin/env python3
"""Instructions per frame of the forwarding engine from a callgrind profile of the `engine`
bench (crates/dp/benches/engine.rs): the inclusive instructions of calls to
`Forwarder::poll`, less those of the inject ports' rx_burst and tx_burst it calls, over the
frames injected (calls to `InjectPort::inject`; where the compiler inlined it into the
bench loop, the unicast cases' transmitted bursts x 32)."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cg_per_frame import call_costs  # noqa: E402

calls, inclusive = call_costs(sys.argv[1])


def one(pattern):
    found = [fn for fn in calls if re.search(pattern, fn)]
    if len(found) != 1:
        sys.exit(f"{pattern}: {found}")
    return found[0]


poll = one(r"engine::Forwarder::poll$")
# A frame is one call of `inject` (which may call `inject_with_hdr`, or have it inlined).
inject = one(r"InjectPort::inject$") if any(
    re.search(r"InjectPort::inject$", fn) for fn in calls
) else one(r"InjectPort::inject_with_hdr$")
ports = [fn for fn in calls if re.search(r"InjectPort as qswitch_dp::port::Port>::(rx|tx)_burst$", fn)]
frames = calls[inject]
if frames < calls[poll]:
    # `inject` was inlined into the bench loop (only the set-up's calls are left): count
    # the frames as transmitted instead, a whole burst of 32 to one port a time (the unicast
    # cases; not right for broadcast, which inlines differently).
    tx = [p for p in ports if p.endswith("tx_burst")]
    frames = sum(calls[p] for p in tx) * 32
    print("inject inlined: frames counted as tx_burst calls x 32")
engine = inclusive[poll] - sum(inclusive[p] for p in ports)
print(f"{poll}: {calls[poll]} calls, {inclusive[poll]} instructions inclusive")
for p in ports:
    print(f"{p}: {calls[p]} calls, {inclusive[p]} instructions inclusive")
print(f"frames: {frames}")
print(f"engine instructions per frame: {engine / frames:.1f}")
