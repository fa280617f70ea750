#!/usr/bin/env python3
"""Instructions per frame of the forwarding engine from a callgrind profile of the `engine`
bench (crates/dp/benches/engine.rs): the inclusive instructions of calls to
`Forwarder::poll`, less those of the inject ports' rx_burst and tx_burst it calls, over the
frames injected (calls to `InjectPort::inject`)."""
import re
import sys

fn_names = {}  # callgrind's name compression: "(id) name" defines, "(id)" refers
calls, inclusive = {}, {}
callee, pending = None, None


def resolve(v):
    m = re.match(r"\((\d+)\)(?: (.*))?", v)
    if not m:
        return v
    if m.group(2):
        fn_names[m.group(1)] = m.group(2)
    return fn_names.get(m.group(1), "?")


with open(sys.argv[1]) as f:
    for line in f:
        line = line.rstrip("\n")
        if line.startswith("fn="):
            resolve(line[3:])
        elif line.startswith("cfn="):
            callee = resolve(line[4:])
        elif line.startswith("calls="):
            pending = int(line[6:].split()[0])
        elif pending is not None:
            parts = line.split()
            if len(parts) >= 2:
                calls[callee] = calls.get(callee, 0) + pending
                inclusive[callee] = inclusive.get(callee, 0) + int(parts[1])
            pending = None


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
