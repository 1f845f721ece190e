#!/usr/bin/env python3
"""Table of README.md and short_prompts.svg from raw/short.jsonl (no plotting dependency).

  python3 chart.py

raw/short.jsonl: `bench --device gpu -p 2,4,8,16,32 -n 32 -r 3` of this tree (`hipfire`) and of
the tree before it (`hipfire-prev`), all resident and with 16 of 32 layers spilled (passback),
two interleaved rounds; avg_ts is the mean of 3 repetitions.
"""
import json
import pathlib
import statistics as st

HERE = pathlib.Path(__file__).resolve().parent
TESTS = ["pp2", "pp4", "pp8", "pp16", "pp32", "tg32"]


def load():
    out = {}
    for line in (HERE / "raw/short.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.setdefault((d["placement"], d["test"], d["engine"]), []).append(d["avg_ts"])
    return out


def svg(data):
    w, h, left, top, bw, bh = 700, 300, 60, 30, 600, 220
    places = [("resident", "#36c"), ("spilled16", "#e80")]
    ymax = 3.0
    x = lambda i: left + (i + 0.5) * bw / len(TESTS)
    y = lambda v: top + bh - v / ymax * bh
    p = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
         '<text x="4" y="14">8B Q4_K on the H200: this tree ÷ the tree before, by test (blue all resident, orange 16 of 32 spilled)</text>']
    for v in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
        p.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + bw}" y2="{y(v):.1f}" stroke="{"#999" if v == 1.0 else "#eee"}"/>')
        p.append(f'<text x="20" y="{y(v) + 4:.1f}">{v:.1f}×</text>')
    for i, t in enumerate(TESTS):
        p.append(f'<text x="{x(i) - 12:.1f}" y="{top + bh + 16}">{t}</text>')
        for j, (pl, col) in enumerate(places):
            new, old = data[(pl, t, "hipfire")], data[(pl, t, "hipfire-prev")]
            r = st.median(new) / st.median(old)
            bx = x(i) - 22 + 22 * j
            p.append(f'<rect x="{bx:.1f}" y="{y(r):.1f}" width="20" height="{y(0) - y(r):.1f}" fill="{col}" opacity="0.7"/>')
            p.append(f'<text x="{bx:.1f}" y="{y(r) - 3:.1f}" font-size="9">{r:.2f}</text>')
    p.append("</svg>")
    return "\n".join(p)


if __name__ == "__main__":
    data = load()
    print("| placement | test | this tree (rounds) | before (rounds) | ratio of medians |\n|---|---|---|---|---|")
    for pl in ("resident", "spilled16"):
        for t in TESTS:
            new, old = data[(pl, t, "hipfire")], data[(pl, t, "hipfire-prev")]
            print(f"| {pl} | {t} | {' / '.join(f'{v:.1f}' for v in new)} | {' / '.join(f'{v:.1f}' for v in old)} | {st.median(new) / st.median(old):.2f} |")
    (HERE / "short_prompts.svg").write_text(svg(data))
