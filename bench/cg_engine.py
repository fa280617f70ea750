#!/usr/bin/env python3
"""Instructions per frame of the forwarding engine from a callgrind profile of the `engine`
bench (crates/dp/benches/engine.rs): the inclusive instructions of calls to
`Forwarder::poll`, less those of the inject ports' rx_burst and tx_burst it calls, over the
frames injected (calls to `InjectPort::inject`)."""
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
engine = inclusive[poll] - sum(inclusive[p] for p in ports)
print(f"{poll}: {calls[poll]} calls, {inclusive[poll]} instructions inclusive")
for p in ports:
    print(f"{p}: {calls[p]} calls, {inclusive[p]} instructions inclusive")
print(f"frames: {frames}")
print(f"engine instructions per frame: {engine / frames:.1f}")
