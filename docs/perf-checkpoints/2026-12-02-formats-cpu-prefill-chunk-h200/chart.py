#!/usr/bin/env python3
"""Tables of README.md and formats.svg from this record's raw folders (no plotting dependency).

  python3 chart.py

raw/formats.log: three runs of `gemv_gbs` per width (format, threads, GEMV GB/s, read GB/s,
ratio); raw/cpu-prefill.jsonl: pp512 at 16 threads, hipfire at 128 / 256 / 512-token AMX chunks
and llama-bench (CPU build), two interleaved rounds; raw-512-confirm/cpu-prefill.jsonl: the
512-token build and llama-bench again in the next call.
"""
import json
import pathlib
import re
import statistics as st

HERE = pathlib.Path(__file__).resolve().parent


def formats():
    ratios, k = {}, None
    for line in (HERE / "raw/formats.log").read_text().splitlines():
        m = re.match(r"== run \d+ k (\d+)", line)
        if m:
            k = int(m.group(1))
            continue
        f = line.split()
        if len(f) == 6 and f[1] == "16":
            ratios.setdefault((f[0], k), []).append(float(f[4]))
    return ratios


def prefill(path):
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out.setdefault(d["engine"], []).extend(d["samples_ts"])
    return out


def svg(ratios):
    names = sorted({n for n, _ in ratios}, key=lambda n: ["q4_k", "q3_k", "q2_k", "iq4_xs", "iq4_nl", "q5_0", "q5_1", "q5_k"].index(n))
    w, left, bw = 640, 70, 500
    h = 40 + 36 * len(names)
    x = lambda v: left + (v - 0.5) / 0.8 * bw
    p = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         '<text x="70" y="14">GEMV / same-run read, 16 threads: dots = runs, bar = median (blue k 4096, orange k 14336); line 0.85</text>']
    for i, n in enumerate(names):
        for j, (k, col) in enumerate(((4096, "#36c"), (14336, "#e80"))):
            y = 28 + 36 * i + 14 * j
            v = ratios.get((n, k), [])
            if v:
                p.append(f'<rect x="{x(0.5):.1f}" y="{y}" width="{x(st.median(v)) - x(0.5):.1f}" height="10" fill="{col}" opacity="0.5"/>')
                p += [f'<circle cx="{x(r):.1f}" cy="{y + 5}" r="3" fill="{col}"/>' for r in v]
        p.append(f'<text x="4" y="{28 + 36 * i + 16}">{n}</text>')
    p.append(f'<line x1="{x(0.85):.1f}" y1="20" x2="{x(0.85):.1f}" y2="{h - 4}" stroke="#c33" stroke-dasharray="3,3"/>')
    p.append("</svg>")
    return "\n".join(p)


if __name__ == "__main__":
    r = formats()
    print("| format | k 4096 runs | median | k 14336 runs | median |\n|---|---|---|---|---|")
    for n in ["q4_k", "q3_k", "q2_k", "iq4_xs", "iq4_nl", "q5_0", "q5_1", "q5_k"]:
        a, b = r[(n, 4096)], r[(n, 14336)]
        print(f"| {n} | {' / '.join(f'{v:.2f}' for v in a)} | {st.median(a):.2f} | {' / '.join(f'{v:.2f}' for v in b)} | {st.median(b):.2f} |")
    for name in ("raw/cpu-prefill.jsonl", "raw-512-confirm/cpu-prefill.jsonl"):
        print(f"\n{name}:")
        for eng, s in prefill(HERE / name).items():
            print(f"  {eng}: samples {[round(v, 1) for v in s]} median {st.median(s):.1f}")
    (HERE / "formats.svg").write_text(svg(r))
