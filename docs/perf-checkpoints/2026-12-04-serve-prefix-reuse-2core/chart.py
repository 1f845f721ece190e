"""TTFT of a second chat turn, prefix reused vs cold, per conversation length, from the JSON here.

python3 chart.py  ->  chart.png (one bar pair per run file: the median over its repetitions of
the client-side TTFT of turn 2 served by the server that holds turn 1, and of the same turn 2
sent to a fresh server; log scale; each bar labelled with its median in seconds).
"""
import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent


def runs():
    out = []
    for path in sorted(HERE.glob("*_w*.json")):
        d = json.loads(path.read_text())
        rows = d["rows"]
        tokens = rows[0]["turn2_cold"]["usage"]["prompt_tokens"]
        reuse = statistics.median(r["turn2_reuse"]["ttft_s"] for r in rows)
        cold = statistics.median(r["turn2_cold"]["ttft_s"] for r in rows)
        out.append((path.stem.split("_w")[0], tokens, reuse, cold))
    return sorted(out, key=lambda r: (r[0], r[1]))


def main():
    data = runs()
    fig, ax = plt.subplots(figsize=(1.8 * len(data) + 2, 4))
    xs = range(len(data))
    width = 0.38
    for off, idx, label, color in ((-width / 2, 2, "turn 2, prefix reused", "C0"),
                                   (width / 2, 3, "turn 2, cold (fresh server)", "C3")):
        bars = ax.bar([x + off for x in xs], [r[idx] for r in data], width, label=label,
                      color=color)
        ax.bar_label(bars, fmt="%.2f s", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r[0]}\n{r[1]} prompt tokens" for r in data])
    ax.set_yscale("log")
    ax.set_ylabel("time to first token, s (median)")
    ax.set_title("hipfire serve, 2-core VM: second chat turn")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "chart.png", dpi=110)


if __name__ == "__main__":
    main()
