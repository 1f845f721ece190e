#!/usr/bin/env python3
"""Tables of README.md and prefill_vs_spilled.svg from this record's raw files.

  python3 chart.py [RAW_DIR]   # default: raw/ (hipfire-pp.jsonl, llama-pp.json, h2d.txt)

hipfire rows: `hipfire bench --json` rows tagged with a label (b<budget>[-...]); llama.cpp rows:
llama-bench -o json. The streaming bound of a spilled run is max(spilled bytes / pinned H2D,
the all-resident prefill time of the same prompt), per the issue's definition.
"""
import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
RAW = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "raw"
N_LAYER = 32


def hipfire():
    rows = {}
    for line in (RAW / "hipfire-pp.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d.get("error"):
            continue
        rows[(d["label"], d["test"])] = d
    return rows


def llama():
    out = {}
    for r in json.loads((RAW / "llama-pp.json").read_text()):
        out[(r["n_gpu_layers"], bool(r["flash_attn"]), r["n_prompt"])] = r["avg_ts"]
    return out


def h2d():
    m = re.search(r"([0-9.]+) GB/s", (RAW / "h2d.txt").read_text())
    return float(m.group(1))


def spilled_gib(placement):
    m = re.search(r"(\d+) spilled to pinned host memory \(([0-9.]+) GiB", placement)
    return (int(m.group(1)), float(m.group(2))) if m else (0, 0.0)


def main():
    h, l, bw = hipfire(), llama(), h2d()
    print(f"pinned H2D: {bw:.1f} GB/s\n")
    print("| resident / spilled | test | hipfire tok/s | llama.cpp FA off | FA on | ratio (FA off) | ratio (FA on) | bound tok/s | hipfire / bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    series = {}
    for budget in (32, 24, 16, 8):
        for p in (512, 2048):
            r = h.get((f"b{budget}", f"pp{p}"))
            if not r:
                continue
            ngl = 99 if budget == 32 else budget
            off, on = l.get((ngl, False, p)), l.get((ngl, True, p))
            n_sp, gib = spilled_gib(r.get("placement", ""))
            res = h.get(("b32", f"pp{p}"))
            t_res = p / res["avg_ts"] if res else 0.0
            t_copy = gib * (1 << 30) / (bw * 1e9)
            bound = p / max(t_copy, t_res) if n_sp else None
            f = lambda v: f"{v:.0f}" if v else "—"
            rr = lambda v: f"{r['avg_ts'] / v:.2f}" if v else "—"
            print(f"| {budget} / {N_LAYER - budget} | pp{p} | {r['avg_ts']:.0f} ± {r['stddev_ts']:.0f} | {f(off)} | {f(on)} | {rr(off)} | {rr(on)} | {f(bound)} | {r['avg_ts'] / bound:.2f} |" if bound else
                  f"| {budget} / {N_LAYER - budget} | pp{p} | {r['avg_ts']:.0f} ± {r['stddev_ts']:.0f} | {f(off)} | {f(on)} | {rr(off)} | {rr(on)} | — | — |")
            series.setdefault(p, []).append((N_LAYER - budget, r["avg_ts"], off, on))
    print()
    for label in sorted({k[0] for k in h} - {f"b{b}" for b in (32, 24, 16, 8)}):
        cells = [f"{k[1]} {v['avg_ts']:.0f}" for k, v in sorted(h.items()) if k[0] == label]
        print(f"- {label}: " + ", ".join(cells))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib absent: no chart)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for p, pts in sorted(series.items()):
        xs = [x for x, *_ in pts]
        ax.plot(xs, [y for _, y, _, _ in pts], marker="o", label=f"hipfire pp{p}")
        ax.plot(xs, [o for *_, o, _ in pts], marker="x", linestyle="--", label=f"llama.cpp pp{p} FA off")
    ax.set_xlabel("layers spilled to host memory (of 32)")
    ax.set_ylabel("prefill tok/s")
    ax.set_yscale("log")
    ax.set_title("Prefill, synthetic Llama-3-8B Q4_K, H200 + 16-core Xeon")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "prefill_vs_spilled.svg")
    print("wrote prefill_vs_spilled.svg")


if __name__ == "__main__":
    main()
