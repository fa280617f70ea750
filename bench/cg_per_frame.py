#!/usr/bin/env python3
"""Instructions per frame of the vhost-user port code from a callgrind profile of the
vhost_path bench: the inclusive instructions of calls to the vhost-user port's rx_burst and
tx_burst over the frames they moved (rx_burst calls x 32: every burst of the bench is full)."""
import re
import sys

BURST = 32


def call_costs(path):
    """Per called function of a callgrind profile: (calls, inclusive Ir), summed over call
    sites. bench/cg_engine.py reads profiles with it too."""
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

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                resolve(line[3:])
            elif line.startswith("cfn="):
                callee = resolve(line[4:])
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif pending is not None:
                # The line after calls= holds the call's inclusive cost.
                parts = line.split()
                if len(parts) >= 2:
                    calls[callee] = calls.get(callee, 0) + pending
                    # The first event (Ir) after the position; more follow with --cache-sim.
                    inclusive[callee] = inclusive.get(callee, 0) + int(parts[1])
                pending = None
    return calls, inclusive


def main():
    calls, inclusive = call_costs(sys.argv[1])

    # The port's Port::rx_burst/tx_burst (never inlined); profiles of older builds name the
    # inner rings:: functions instead.
    total, frames = 0, 0
    for pattern in (r"VhostUserPort as qswitch_dp::port::Port>::(rx_burst|tx_burst)$",
                    r"vhost_user::rings::(rx_burst|tx_burst)$"):
        found = [fn for fn in sorted(calls) if re.search(pattern, fn)]
        if len(found) == 2:
            break
    for fn in found:
        print(f"{fn}: {calls[fn]} calls, {inclusive[fn]} instructions inclusive")
        total += inclusive[fn]
        if fn.endswith("rx_burst"):
            frames = calls[fn] * BURST
    if not frames:
        sys.exit("no rx_burst calls in the profile")
    print(f"instructions per frame (rx_burst + tx_burst): {total / frames:.1f}")


if __name__ == "__main__":
    main()
