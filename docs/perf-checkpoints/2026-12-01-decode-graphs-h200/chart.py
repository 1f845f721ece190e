#!/usr/bin/env python3
"""Tables of README.md and decode_vs_depth.svg from this record's raw folders.

  python3 chart.py

raw/: the final call (call.sh): `hipfire bench --json` rows ({"test": "tg32 @ dD", "avg_ts",
"stddev_ts"}) and `llama-bench -o json` rows ({"n_depth", "avg_ts", "stddev_ts",
"n_gpu_layers"}), one file per run; attention.jsonl from attention_timing.
raw-graphs/, raw-kernel-ab/, raw-variants/: the earlier calls (their call.sh beside them).
The SVG is written by hand (no plotting dependency).
"""
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
DEPTHS = [16, 1024, 4096, 16384]
# llama.cpp FA off, issue 18's table (not this run; same source, same file shape): the chart
# shows it dashed for context only.
FA_OFF_ISSUE = {16: 241.9, 1024: 205.3, 4096: 143.4}


def hf(path):
    rows = json.loads(path.read_text())
    return {int(r["test"].split(" @ d")[1]): (r["avg_ts"], r["stddev_ts"]) for r in rows}


def ll(path):
    return {r["n_depth"]: (r["avg_ts"], r["stddev_ts"]) for r in json.loads(path.read_text())}


def attention(path):
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if "depth" in d:
            out[(d["depth"], d["variant"])] = d
    return out


def main():
    raw = HERE / "raw"
    new = hf(raw / "resident-new.json")
    off = hf(raw / "resident-new-nographs.json")
    before = hf(raw / "resident-e481bb9.json")
    llama = ll(raw / "resident-llama-fa1.json")
    print("| depth | hipfire | llama.cpp FA on | hipfire ÷ FA on | hipfire, graphs off | e481bb9 | e481bb9 ÷ FA on |")
    print("|---|---|---|---|---|---|---|")
    for d in DEPTHS:
        n, l, o, b = new[d], llama[d], off[d], before[d]
        print(f"| {d} | {n[0]:.1f} ± {n[1]:.1f} | {l[0]:.1f} ± {l[1]:.1f} | {n[0] / l[0]:.3f} "
              f"| {o[0]:.1f} ± {o[1]:.1f} | {b[0]:.1f} ± {b[1]:.1f} | {b[0] / l[0]:.3f} |")
    print()
    print("| layers spilled (resident) | hipfire passback | llama.cpp FA on, same layers on its CPU | ratio |")
    print("|---|---|---|---|")
    for b in (24, 16, 8):
        h = hf(raw / f"spill{b}-new.json")[4096]
        l = ll(raw / f"spill{b}-llama-fa1.json")[4096]
        print(f"| {32 - b} ({b}) | {h[0]:.1f} ± {h[1]:.1f} | {l[0]:.1f} ± {l[1]:.1f} | {h[0] / l[0]:.2f} |")
    print()
    fin = attention(raw / "attention.jsonl")
    old = attention(HERE / "raw-kernel-ab" / "at-old.jsonl")
    print("| depth | planned, this tree µs (chunks × heads) | GB/s | % of 4.4 TB/s | previous kernel, its plan µs |")
    print("|---|---|---|---|---|")
    for d in DEPTHS:
        f = fin[(d, "split planned")]
        o = old.get((d, "split planned"))
        ostr = f"{o['us']:.1f} ({o['n_chunks']} × {o['heads_per_block']})" if o else "—"
        print(f"| {d} | {f['us']:.1f} ({f['n_chunks']} × {f['heads_per_block']}) | {f['gb_per_s']:.0f} "
              f"| {f['gb_per_s'] / 4400 * 100:.0f} % | {ostr} |")
    print()
    names = ["as built (no register cap)", "HF_ATTN_UNROLL=8", "HF_ATTN_MINB=4", "both"]
    var = [attention(HERE / "raw-variants" / f"at-{i}.jsonl") for i in range(4)]
    print("| depth | plan | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for d in (1024, 4096, 16384):
        for v in ("split 16 x1", "split 33 x2", "split 66 x2", "split 44 x4", "split planned"):
            cells = [f"{x[(d, v)]['us']:.1f}" if (d, v) in x else "—" for x in var]
            print(f"| {d} | {v.replace('split ', '')} | " + " | ".join(cells) + " |")
    svg(new, off, before, llama)


def svg(new, off, before, llama):
    w, h, left, bottom, top, right = 640, 400, 60, 50, 30, 190
    xs = {d: left + i * (w - left - right) / (len(DEPTHS) - 1) for i, d in enumerate(DEPTHS)}
    ymax = 360.0

    def y(v):
        return h - bottom - v / ymax * (h - bottom - top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<text x="{left}" y="18">Decode tok/s against depth, Llama-3-8B Q4_K (synthetic), H200, all resident</text>']
    for v in range(0, int(ymax) + 1, 50):
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    for d, x in xs.items():
        parts.append(f'<text x="{x:.1f}" y="{h - bottom + 18}" text-anchor="middle">{d}</text>')
    parts.append(f'<text x="{(left + w - right) / 2:.1f}" y="{h - 12}" text-anchor="middle">positions in the KV cache</text>')
    series = [
        ("hipfire (this tree)", "#c0392b", {d: new[d][0] for d in DEPTHS}, ""),
        ("llama.cpp FA on", "#2c3e50", {d: llama[d][0] for d in DEPTHS}, ""),
        ("hipfire, graphs off", "#e67e22", {d: off[d][0] for d in DEPTHS}, ""),
        ("hipfire e481bb9", "#95a5a6", {d: before[d][0] for d in DEPTHS}, ""),
        ("llama.cpp FA off (issue 18)", "#2c3e50", FA_OFF_ISSUE, ' stroke-dasharray="5,4"'),
    ]
    for i, (name, colour, pts, dash) in enumerate(series):
        path = " ".join(f"{xs[d]:.1f},{y(v):.1f}" for d, v in sorted(pts.items()))
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for d, v in pts.items():
            parts.append(f'<circle cx="{xs[d]:.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>')
        ly = top + 20 + i * 18
        parts.append(f'<line x1="{w - right + 15}" x2="{w - right + 35}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{w - right + 40}" y="{ly + 4}">{name}</text>')
    parts.append("</svg>")
    (HERE / "decode_vs_depth.svg").write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
