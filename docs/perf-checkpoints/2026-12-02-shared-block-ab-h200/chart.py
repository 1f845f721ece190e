#!/usr/bin/env python3
"""Table of README.md and ab.svg from this record's raw/ (no plotting dependency).

  python3 chart.py

raw/ab.jsonl: `hipfire bench -p 512 -n 64 -r 1 --json`, before (hipfire-base, c00fb4e) and after
(hipfire, the shared block), 3 interleaved rounds at 32 / 24 / 16 / 8 layers resident;
raw/ab16.jsonl: 6 more rounds of tg64 at 16 resident (rerun16.sh).
"""
import json
import pathlib
import statistics as st

HERE = pathlib.Path(__file__).resolve().parent


def rows():
    out = []
    for name in ("ab.jsonl", "ab16.jsonl"):
        out += [json.loads(l) for l in (HERE / "raw" / name).read_text().splitlines() if l.strip()]
    return [r for r in out if "ts" in r]


def table(rs):
    lines = ["| test | resident / 32 | before (median) | after (median) | after / before | runs |",
             "|---|---|---|---|---|---|"]
    bars = []
    for t in ("pp512", "tg64"):
        for b in (32, 24, 16, 8):
            o = [r["ts"] for r in rs if r["test"] == t and r["budget"] == b and r["bin"] == "hipfire-base"]
            n = [r["ts"] for r in rs if r["test"] == t and r["budget"] == b and r["bin"] == "hipfire"]
            if not (o and n):
                continue
            ratio = st.median(n) / st.median(o)
            lines.append(f"| {t} | {b} | {st.median(o):.1f} | {st.median(n):.1f} | {ratio:.3f} | {len(o)} + {len(n)} |")
            bars.append((f"{t} {b}", ratio))
    return "\n".join(lines), bars


def svg(bars):
    w, h, left, top, bw = 640, 40 + 28 * len(bars), 110, 20, 400
    lo, hi = 0.9, 1.1
    x = lambda v: left + (v - lo) / (hi - lo) * bw
    p = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<text x="{left}" y="14">after / before (median), shared block vs c00fb4e; lines at 0.97 and 1.0</text>']
    for i, (label, r) in enumerate(bars):
        y = top + 10 + 28 * i
        p.append(f'<text x="4" y="{y + 14}">{label}</text>')
        p.append(f'<rect x="{x(1.0) if r >= 1 else x(r):.1f}" y="{y}" width="{abs(x(r) - x(1.0)):.1f}" height="18" fill="#4a7"/>')
        p.append(f'<text x="{x(max(r, 1.0)) + 4:.1f}" y="{y + 14}">{r:.3f}</text>')
    for v in (0.97, 1.0):
        p.append(f'<line x1="{x(v):.1f}" y1="{top}" x2="{x(v):.1f}" y2="{h - 4}" stroke="#c33" stroke-dasharray="3,3"/>')
    p.append("</svg>")
    return "\n".join(p)


if __name__ == "__main__":
    t, bars = table(rows())
    print(t)
    (HERE / "ab.svg").write_text(svg(bars))
