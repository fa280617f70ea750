#!/usr/bin/env bash
# Before/after of one scenario with one harness: alternates OLD and NEW as the switch
# (QSWITCH_DAEMON), one run each per round, in the order AB, BA, AB ...; the harness is
# NEW's. Prints, per metric of the runs, the median [min-max] of each build and new/old.
#   bench/before-after.sh OLD NEW ROUNDS -- SCENARIO [bench options]
# e.g. bench/before-after.sh /tmp/qswitch-old target/release/qswitch 5 -- pvp --only qswitch --seconds 5
# OLD or NEW may be BIN:FILE: that side runs with $QSWITCH_BENCH_EXTRA set to FILE's text (pvp
# appends it to qswitch's config), so one binary with and without a feature is compared:
#   bench/before-after.sh Q Q:bench/extra/ipfix.toml 5 -- pvp --only qswitch --seconds 5
set -euo pipefail
[ $# -ge 5 ] && [ "$4" = "--" ] || { echo "usage: $0 OLD NEW ROUNDS -- SCENARIO [options]" >&2; exit 2; }
spec_bin() { readlink -f "${1%%:*}"; }
spec_extra() { case "$1" in *:*) cat "${1#*:}" ;; esac; }
old=$(spec_bin "$1"); new=$(spec_bin "$2"); old_extra=$(spec_extra "$1"); new_extra=$(spec_extra "$2")
rounds=$3; shift 4
scenario=$1
out=$(mktemp -d /tmp/qswitch-before-after.XXXXXX)
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for who in $order; do
    if [ "$who" = old ]; then bin=$old; extra=$old_extra; else bin=$new; extra=$new_extra; fi
    echo "== round $r: $who ($bin${extra:+ with extra config})" >&2
    QSWITCH_BENCH_EXTRA=$extra QSWITCH_DAEMON=$bin "$new" bench "$@" --runs 1 --out "$out/$who-$r" >"$out/$who-$r.log" 2>&1 \
      || { echo "run failed, see $out/$who-$r.log" >&2; tail -5 "$out/$who-$r.log" >&2; exit 1; }
  done
done
python3 - "$out" "$scenario" "$rounds" <<'PY'
import json, statistics, sys, os
out, scenario, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def leaves(v, path=""):
    if isinstance(v, bool): return
    if isinstance(v, (int, float)): yield path, float(v); return
    if isinstance(v, dict):
        for k, x in v.items():
            if k in ("samples", "round", "seq"): continue
            yield from leaves(x, f"{path}.{k}" if path else k)
vals = {}
for who in ("old", "new"):
    for r in range(1, rounds + 1):
        rep = json.load(open(os.path.join(out, f"{who}-{r}", f"{scenario}.json")))
        for run in rep["runs"]:
            for p, x in leaves(run):
                c = run["contender"] + (f" {run['frame_size']} B" if "frame_size" in run else "")
                c += f" {run['load_pools']}p" if run.get("load_pools") else ""
                vals.setdefault((c, p), {}).setdefault(who, []).append(x)
print(f"{scenario}: {rounds} rounds, interleaved; median [min-max]; results in {out}")
for (c, p), d in sorted(vals.items()):
    o, n = d.get("old", []), d.get("new", [])
    if not o or not n: continue
    mo, mn = statistics.median(o), statistics.median(n)
    ratio = f"{mn / mo:.3f}" if mo else "-"
    print(f"{c:>18} {p:<24} old {mo:10.3f} [{min(o):.3f}-{max(o):.3f}]  new {mn:10.3f} [{min(n):.3f}-{max(n):.3f}]  new/old {ratio}")
PY
