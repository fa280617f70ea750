#!/usr/bin/env bash
# What configured features cost, in one interleaved run: one build of qswitch as the pvp
# switch, once plain ("off") and once per FILE with that file's TOML appended to its config
# ($QSWITCH_BENCH_EXTRA), one run each per round, the order rotated every round. Prints per
# case (frame size, load shape) the median [min-max] Mpps of each variant and its ratio to
# "off", and every run's figure (this host's pvp can be bimodal: look at the runs).
#   bench/feature-cost.sh BIN ROUNDS FILE... -- [pvp options]
# e.g. bench/feature-cost.sh target/release/qswitch 5 bench/extra/*.toml -- --seconds 5
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BIN ROUNDS FILE... -- [pvp options]" >&2; exit 2; }
bin=$(readlink -f "$1"); rounds=$2; shift 2
variants=(off)
while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=$(mktemp -d /tmp/qswitch-feature-cost.XXXXXX)
n=${#variants[@]}
for r in $(seq 1 "$rounds"); do
  for i in $(seq 0 $((n - 1))); do
    v=${variants[$(( (i + r - 1) % n ))]}
    name=$(basename "$v" .toml)
    extra=""; [ "$v" != off ] && extra=$(cat "$v")
    echo "== round $r: $name" >&2
    QSWITCH_BENCH_EXTRA=$extra QSWITCH_DAEMON=$bin "$bin" bench pvp --only qswitch "$@" --runs 1 \
      --out "$out/$name-$r" >"$out/$name-$r.log" 2>&1 \
      || { echo "run failed, see $out/$name-$r.log" >&2; tail -5 "$out/$name-$r.log" >&2; exit 1; }
  done
done
names=$(for v in "${variants[@]}"; do basename "$v" .toml; done)
python3 - "$out" "$rounds" $names <<'PY'
import json, os, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
vals = {}
for name in names:
    for r in range(1, rounds + 1):
        rep = json.load(open(os.path.join(out, f"{name}-{r}", "pvp.json")))
        for run in rep["runs"]:
            case = f"{run['frame_size']} B {run.get('load_pools', 0)}p"
            vals.setdefault(case, {}).setdefault(name, []).append(run["mpps_rx"])
print(f"pvp Mpps received, {rounds} rounds interleaved; median [min-max] (ratio to off); results in {out}")
for case, d in sorted(vals.items()):
    off = statistics.median(d["off"])
    for name in names:
        v = d.get(name, [])
        if not v: continue
        m = statistics.median(v)
        print(f"{case:>10} {name:<16} {m:7.2f} [{min(v):.2f}-{max(v):.2f}]  x{m / off:.3f}  runs: {' '.join(f'{x:.2f}' for x in v)}")
PY
