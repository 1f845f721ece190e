"""Weight GB/s (CPU time) of gemv_rows_multi per column count, base vs new, from the JSON here.

python3 chart.py  ->  chart.png (one panel per call mode and thread count; each line a format,
dashed = base 2e3b54e, solid = a255c33; per point the best of the two interleaved runs).
python3 chart.py lanes  ->  chart_lanes.png, the same from lanes_{base,new}_run*.json (base
486ff41, new = the rows-in-lanes kernels, be4b916; best of three interleaved runs), and prints
table.md's "Rows in lanes" tables (CPU time and wall time); python3 chart.py lanes41 and
lanesall the same from lanes41_*.json (new = 7be7146, with Q4_1) and lanesall_*.json (new =
927a60e, with Q5_K) into chart_lanes41.png and chart_lanesall.png.
"""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent
FORMATS = ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_1"]


def best(version, field="cpu_gbs"):
    out = {}
    for path in sorted(HERE.glob(f"{version}_run*.json")):
        for r in json.loads(path.read_text()):
            key = (r["format"], r["mode"], r["threads"], r["cols"])
            out[key] = max(out.get(key, 0.0), r[field])
    return out


def tables(prefix):
    """Markdown tables, base → new with each build's ratio to its own B = 1."""
    for field, what in (("cpu_gbs", "CPU-time"), ("gbs", "wall")):
        base, new = best(f"{prefix}base", field), best(f"{prefix}new", field)
        for mode, threads in sorted({(k[1], k[2]) for k in new}):
            cols = sorted({k[3] for k in new if k[1:3] == (mode, threads)})
            print(f"\n#### {mode}, {threads} thread(s): {what} GB/s, base → new "
                  "(ratio to B = 1 of the same build)\n")
            print("| format | " + " | ".join(f"B={c}" for c in cols) + " |")
            print("|---" * (len(cols) + 1) + "|")
            for fmt in FORMATS:
                if (fmt, mode, threads, 1) not in new:
                    continue
                b1, n1 = base[(fmt, mode, threads, 1)], new[(fmt, mode, threads, 1)]
                cells = []
                for c in cols:
                    b, n = base[(fmt, mode, threads, c)], new[(fmt, mode, threads, c)]
                    if c == 1:
                        cells.append(f"{b:.2f} → {n:.2f}")
                    else:
                        cells.append(f"{b:.2f} ({b / b1:.2f}) → {n:.2f} ({n / n1:.2f})")
                print(f"| {fmt} | " + " | ".join(cells) + " |")


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    prefix = f"{name}_" if name else ""
    if name:
        tables(prefix)
    base, new = best(f"{prefix}base"), best(f"{prefix}new")
    panels = sorted({(k[1], k[2]) for k in new})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (mode, threads) in zip(axes[0], panels):
        for i, fmt in enumerate(FORMATS):
            color = f"C{i}"
            for data, style, label in ((base, "--", "base"), (new, "-", "new")):
                pts = sorted((k[3], v) for k, v in data.items() if k[:3] == (fmt, mode, threads))
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, style, color=color, marker="o", label=f"{fmt} {label}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("columns B")
        ax.set_ylabel("weight GB/s (CPU time)")
        ax.set_title(f"{mode}, {threads} thread(s)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / (f"chart_{name}.png" if name else "chart.png"), dpi=110)


if __name__ == "__main__":
    main()
