"""Weight GB/s (CPU time) of gemv_rows_multi per column count, base vs new, from the JSON here.

python3 chart.py  ->  chart.png (one panel per call mode and thread count; each line a format,
dashed = base 2e3b54e, solid = this branch; per point the best of the two interleaved runs).
"""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent
FORMATS = ["q4_k", "q6_k", "q8_0", "q4_0"]


def best(version):
    out = {}
    for path in sorted(HERE.glob(f"{version}_run*.json")):
        for r in json.loads(path.read_text()):
            key = (r["format"], r["mode"], r["threads"], r["cols"])
            out[key] = max(out.get(key, 0.0), r["cpu_gbs"])
    return out


def main():
    base, new = best("base"), best("new")
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
    fig.savefig(HERE / "chart.png", dpi=110)


if __name__ == "__main__":
    main()
