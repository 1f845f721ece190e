#!/usr/bin/env python3
"""Prefill tok/s vs prompt length, base vs new, from raw/*.json (hipfire bench --json).

Usage: python3 chart.py [out.png]. Rows of files named contended-* are left out (see README).
"""
import glob
import json
import os
import sys
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
series = defaultdict(lambda: defaultdict(list))
for path in sorted(glob.glob(os.path.join(here, "raw", "*.json"))):
    name = os.path.basename(path)
    if name.startswith("contended-"):
        continue
    side = "new" if "-new-" in name else "base"
    for row in json.load(open(path)):
        series[side][row["n_prompt"]].append(row["avg_ts"])

for side, rows in sorted(series.items()):
    for n, ts in sorted(rows.items()):
        print(f"{side:5} pp{n:<5} " + " ".join(f"{t:.1f}" for t in ts))

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(6, 4))
for side, rows in sorted(series.items()):
    xs = sorted(rows)
    ax.plot(xs, [sum(rows[x]) / len(rows[x]) for x in xs], marker="o", label=side)
ax.set_xscale("log", base=2)
ax.set_xlabel("prompt tokens")
ax.set_ylabel("prefill tok/s (2 threads)")
ax.set_title("SmolLM2-135M Q4_1, CPU prefill attention")
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "chart.png"))
