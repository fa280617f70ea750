#!/usr/bin/env python3
"""Parses a Prometheus text exposition (file argv[1]) with prometheus_client's parser, the
reference implementation, and prints one JSON object: family name -> {type, samples, max}.
Exits 2 with a message when prometheus_client is missing, 1 when the text does not parse."""
import json
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("prometheus_client is not installed: pip install prometheus_client", file=sys.stderr)
    sys.exit(2)

text = open(sys.argv[1], encoding="utf-8").read()
out = {}
try:
    for fam in text_string_to_metric_families(text):
        values = [s.value for s in fam.samples]
        out[fam.name] = {
            "type": fam.type,
            "samples": len(values),
            "max": max(values) if values else None,
            "labels": sorted({k for s in fam.samples for k in s.labels}),
        }
except Exception as e:  # the parser raises ValueError and friends on bad input
    print(f"does not parse: {e}", file=sys.stderr)
    sys.exit(1)
print(json.dumps(out))
