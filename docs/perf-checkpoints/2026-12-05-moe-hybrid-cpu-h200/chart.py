#!/usr/bin/env python3
"""hipfire against llama.cpp, CPU only (16 threads), per model and test, from json/ of this
record (two interleaved rounds, each engine's rows as `hipfire bench --json` and
`llama-bench -o json` wrote them). Prints the table with the ratio of the rounds' means and
writes chart.png (hipfire ÷ llama.cpp) when matplotlib is installed."""
import glob
import json
import os
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
rates = defaultdict(list)  # (model, engine, test) -> tok/s per round
for path in sorted(glob.glob(os.path.join(here, "json", "*.json"))):
    name = os.path.basename(path)[: -len(".json")]
    # <model>-r<round>-<engine>-cpu
    model, rest = name.rsplit("-r", 1)
    engine = rest.split("-")[1]
    for r in json.load(open(path)):
        test = r.get("test") or (f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}")
        rates[(model, engine, test)].append(r["avg_ts"])
mean = lambda v: sum(v) / len(v)
table = []
for (model, engine, test) in sorted(rates):
    if engine != "hipfire":
        continue
    h, l = rates[(model, "hipfire", test)], rates[(model, "llama", test)]
    table.append((model, test, mean(h), mean(l), mean(h) / mean(l)))
    print(f"{model:22s} {test:6s} hipfire {mean(h):7.1f}  llama.cpp {mean(l):7.1f}  ratio {mean(h) / mean(l):.2f}")
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    raise SystemExit(0)
fig, ax = plt.subplots(figsize=(7, 3.5))
labels = [f"{m}\n{t}" for m, t, *_ in table]
ax.bar(range(len(table)), [r for *_, r in table], color=["tab:red" if t.startswith("pp") else "tab:orange" for _, t, *_ in table])
ax.axhline(1.0, color="gray", lw=0.8)
ax.axhline(1.2, color="tab:green", lw=0.8, ls="--", label="target 1.2×")
ax.set_xticks(range(len(table)), labels, fontsize=7)
ax.set_ylabel("hipfire ÷ llama.cpp (tok/s)")
ax.set_title("CPU only, 16 threads, H200 box (Xeon, AMX)")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(here, "chart.png"), dpi=120)
