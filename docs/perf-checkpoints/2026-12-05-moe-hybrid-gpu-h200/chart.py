#!/usr/bin/env python3
"""hipfire against llama.cpp on the GPU box, per row of this record (json/: two interleaved
rounds, `hipfire bench --json` and `llama-bench -o json`, one file per row, round and engine).
Prints the table with the ratio of the rounds' means; draws chart.png (tok/s, both engines)
when matplotlib is installed."""
import glob
import json
import os
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
rates = defaultdict(list)  # (row, engine, test) -> tok/s per round
for path in sorted(glob.glob(os.path.join(here, "json", "*.json"))):
    name = os.path.basename(path)[: -len(".json")]
    # <row>-r<round>-<engine>
    row, rest = name.rsplit("-r", 1)
    engine = rest.split("-", 1)[1]
    for r in json.load(open(path)):
        test = r.get("test") or (f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}")
        rates[(row, engine, test)].append(r["avg_ts"])
mean = lambda v: sum(v) / len(v)
table = []
for (row, engine, test) in sorted(rates):
    if engine != "hipfire":
        continue
    h, l = mean(rates[(row, "hipfire", test)]), mean(rates[(row, "llama", test)])
    table.append((row, test, h, l))
    print(f"{row:48s} {test:6s} hipfire {h:8.1f}  llama.cpp {l:8.1f}  ratio {h / l:.2f}")
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    raise SystemExit(0)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for ax, kind in zip(axes, ("pp", "tg")):
    rows = [t for t in table if t[1].startswith(kind)]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [t[2] for t in rows], 0.4, color="tab:red", label="hipfire")
    ax.bar([x + 0.2 for x in xs], [t[3] for t in rows], 0.4, color="tab:blue", label="llama.cpp")
    ax.set_xticks(list(xs), [t[0].replace("-hipfire", "\nhipfire") for t in rows], fontsize=6)
    ax.set_ylabel(f"{kind} tok/s")
    ax.legend()
fig.suptitle("H200 box, same call, llama.cpp FA on")
fig.tight_layout()
fig.savefig(os.path.join(here, "chart.png"), dpi=120)
