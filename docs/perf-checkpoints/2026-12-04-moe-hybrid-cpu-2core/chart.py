#!/usr/bin/env python3
"""Decode tok/s per round, hipfire vs llama.cpp, from the decode-*.log files of this record
(the last line of each is the JSON summary of scripts/llama_cpp_bench.py). Writes chart.png
when matplotlib is installed, else prints the table."""
import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
rows = []
for path in sorted(glob.glob(os.path.join(here, "decode-*.log"))):
    if "under-load" in path:
        continue
    last = open(path).read().strip().splitlines()[-1]
    d = json.loads(last)
    rows.append((d["gguf"], d["rounds"]["hipfire-cpu"], d["rounds"]["llama.cpp"], d["ratio_hipfire_over_llama"]))
for name, h, l, r in rows:
    print(f"{name}: hipfire {h} llama.cpp {[round(x, 1) for x in l]} ratio of medians {r:.2f}")
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    raise SystemExit(0)
fig, ax = plt.subplots(figsize=(6, 3.5))
for i, (name, h, l, _) in enumerate(rows):
    ax.scatter([i - 0.1] * len(h), h, color="tab:red", label="hipfire" if i == 0 else None)
    ax.scatter([i + 0.1] * len(l), l, color="tab:blue", label="llama.cpp" if i == 0 else None)
ax.set_xticks(range(len(rows)), [r[0] for r in rows])
ax.set_ylabel("decode tok/s (2 threads)")
ax.set_title("CPU decode, synthetic MoE and hybrid files, 2-core VM")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(here, "chart.png"), dpi=120)
