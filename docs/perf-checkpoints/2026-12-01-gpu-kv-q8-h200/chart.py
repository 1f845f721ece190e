#!/usr/bin/env python3
"""Tables of README.md and decode_vs_depth.svg from this record's raw-bench/ folder.

  python3 chart.py

raw-bench/: call2-bench.sh's runs, one JSON file each: `hipfire bench --json` and
`llama-bench -o json` rows, both with "n_depth", "avg_ts", "stddev_ts". The SVG is written by
hand (no plotting dependency).
"""
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
RAW = HERE / "raw-bench"
DEPTHS = [16, 1024, 4096, 16384]
SERIES = [
    ("hipfire, f16 cache", "resident-f16.json", "#d62728", ""),
    ("hipfire, q8_0 cache", "resident-q8.json", "#ff7f0e", ""),
    ("llama.cpp FA on, f16 cache", "resident-llama-fa1.json", "#1f77b4", ""),
    ("llama.cpp FA on, q8_0 cache", "resident-llama-fa1-q8.json", "#17becf", ""),
    ("llama.cpp FA off, f16 cache", "resident-llama-fa0.json", "#7f7f7f", "6,4"),
]


def rows(name):
    return {r["n_depth"]: (r["avg_ts"], r["stddev_ts"]) for r in json.loads((RAW / name).read_text())}


def main():
    s = {label: rows(f) for label, f, _, _ in SERIES}
    hf, hq = s["hipfire, f16 cache"], s["hipfire, q8_0 cache"]
    lf, lq = s["llama.cpp FA on, f16 cache"], s["llama.cpp FA on, q8_0 cache"]
    l0 = s["llama.cpp FA off, f16 cache"]
    print("| depth | hipfire f16 | llama.cpp FA on f16 | ratio | llama.cpp FA off f16 | hipfire q8_0 | llama.cpp FA on q8_0 | ratio | hipfire q8_0 ÷ f16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in DEPTHS:
        off = f"{l0[d][0]:.1f} ± {l0[d][1]:.1f}" if d in l0 else "—"
        print(f"| {d} | {hf[d][0]:.1f} ± {hf[d][1]:.1f} | {lf[d][0]:.1f} ± {lf[d][1]:.1f} | "
              f"{hf[d][0] / lf[d][0]:.3f} | {off} | {hq[d][0]:.1f} ± {hq[d][1]:.1f} | "
              f"{lq[d][0]:.1f} ± {lq[d][1]:.1f} | {hq[d][0] / lq[d][0]:.3f} | {hq[d][0] / hf[d][0]:.3f} |")
    print()
    print("| layers spilled | hipfire passback | llama.cpp FA on, same layers on its CPU | ratio |")
    print("|---|---|---|---|")
    for b in (24, 16, 8):
        h, l = rows(f"spill{b}-f16.json")[4096], rows(f"spill{b}-llama-fa1.json")[4096]
        print(f"| {32 - b} | {h[0]:.1f} | {l[0]:.1f} | {h[0] / l[0]:.2f} |")
    # SVG: x = log2(depth), y = tok/s.
    w, h, ml, mr, mt, mb = 720, 420, 60, 230, 30, 50
    xs = {d: ml + (w - ml - mr) * i / (len(DEPTHS) - 1) for i, d in enumerate(DEPTHS)}
    ymax = 350.0
    y = lambda v: mt + (h - mt - mb) * (1 - v / ymax)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{ml}" y="18">Decode tok/s against depth, Llama-3-8B Q4_K synthetic, all resident, H200</text>']
    for v in range(0, 351, 50):
        out.append(f'<line x1="{ml}" x2="{w - mr}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{ml - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    for d, x in xs.items():
        out.append(f'<text x="{x:.1f}" y="{h - mb + 18}" text-anchor="middle">{d}</text>')
    out.append(f'<text x="{(ml + w - mr) / 2:.1f}" y="{h - 12}" text-anchor="middle">tokens already in context</text>')
    for i, (label, _, color, dash) in enumerate(SERIES):
        pts = " ".join(f"{xs[d]:.1f},{y(v[0]):.1f}" for d, v in sorted(s[label].items()) if d in xs)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{da}/>')
        ly = mt + 20 + 20 * i
        out.append(f'<line x1="{w - mr + 15}" x2="{w - mr + 40}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{da}/>'
                   f'<text x="{w - mr + 46}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    (HERE / "decode_vs_depth.svg").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
