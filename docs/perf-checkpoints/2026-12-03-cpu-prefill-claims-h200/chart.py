#!/usr/bin/env python3
"""Tables of README.md and cpu_prefill.svg from this record's raw folders (no plotting dependency).

  python3 chart.py

raw-N/cpu-prefill.jsonl: pp512 at 16 threads, one line per engine and round (llama.cpp once with
FlashAttention off and once on; avg_ts = the mean of 3 repetitions); raw-N/breakdown.tgz: hipfire's
per-step `cpu batched step` debug lines; raw-N/prefill_gemm.log: one thread's GEMM per shape;
raw-2core/ab.jsonl: the 2-core dev VM's A/B of this tree against the baseline (prefill and decode);
raw-2core/decode*.jsonl: its decode-only A/Bs (ab-decode-2core.sh).
"""
import io
import json
import pathlib
import re
import statistics as st
import tarfile

HERE = pathlib.Path(__file__).resolve().parent
CALLS = ["raw-1", "raw-2", "raw-3"]
COLORS = {"hipfire": "#36c", "hipfire-ac1aaad": "#69c", "hipfire-base": "#999",
          "llama.cpp FA off": "#e80", "llama.cpp FA on": "#c33"}


def rounds(call):
    """{engine label: {round: avg tok/s}}"""
    out = {}
    for line in (HERE / call / "cpu-prefill.jsonl").read_text().splitlines():
        d = json.loads(line)
        eng = d["engine"]
        if eng == "llama.cpp":
            eng += " FA on" if d.get("fa") else " FA off"
        out.setdefault(eng, {})[d["round"]] = d["avg_ts"]
    return out


def breakdown(call):
    """{binary: {field: mean seconds over the logged steps}}"""
    out = {}
    with tarfile.open(HERE / call / "breakdown.tgz") as t:
        for m in t.getmembers():
            text = t.extractfile(m).read().decode()
            steps = [dict(re.findall(r"(\w+_s)=([0-9.]+)", l)) for l in text.splitlines() if "batched step" in l]
            if steps:
                name = m.name.split("breakdown-")[-1].removesuffix(".log")
                out[name] = {k: st.mean(float(s[k]) for s in steps) for k in steps[0]}
    return out


def svg(data):
    w, left, bw, row = 720, 150, 520, 16
    entries = [(c, e, v) for c in CALLS for e, v in data[c].items()]
    h = 40 + row * len(entries) + 12 * len(CALLS)
    top = 320.0
    x = lambda v: left + v / top * bw
    p = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
         '<text x="4" y="14">8B Q4_K pp512, 16 threads, H200 box: dots = rounds, bar = median (tok/s)</text>']
    y = 28
    for c in CALLS:
        p.append(f'<text x="4" y="{y + 9}" font-weight="bold">{c}</text>')
        y += 12
        for e, v in data[c].items():
            vals = list(v.values())
            col = COLORS.get(e, "#000")
            p.append(f'<rect x="{left}" y="{y}" width="{x(st.median(vals)) - left:.1f}" height="10" fill="{col}" opacity="0.5"/>')
            p += [f'<circle cx="{x(r):.1f}" cy="{y + 5}" r="3" fill="{col}"/>' for r in vals]
            p.append(f'<text x="14" y="{y + 9}">{e}</text>')
            p.append(f'<text x="{x(st.median(vals)) + 4:.1f}" y="{y + 9}">{st.median(vals):.1f}</text>')
            y += row
    for t in range(0, int(top) + 1, 50):
        p.append(f'<line x1="{x(t):.1f}" y1="24" x2="{x(t):.1f}" y2="{h - 4}" stroke="#ddd"/>')
    p.append("</svg>")
    return "\n".join(p)


if __name__ == "__main__":
    data = {c: rounds(c) for c in CALLS}
    for c in CALLS:
        print(f"\n{c}: pp512 tok/s by round, median")
        d = data[c]
        best_llama = st.median(d["llama.cpp FA on"].values())
        for e, v in d.items():
            med = st.median(v.values())
            print(f"| {e} | {' / '.join(f'{v[r]:.1f}' for r in sorted(v))} | {med:.1f} | {med / best_llama:.2f} |")
        for b, f in breakdown(c).items():
            print(f"  breakdown {b}: " + ", ".join(f"{k} {v:.3f}" for k, v in f.items()))
    ab = HERE / "raw-2core" / "ab.jsonl"
    if ab.exists():
        rows = {}
        for line in ab.read_text().splitlines():
            d = json.loads(line)
            rows.setdefault((d["model"], d["test"], d["label"]), []).append(d["avg_ts"])
        print("\n2-core A/B (tok/s by round, median):")
        for (m, t, l), v in sorted(rows.items()):
            print(f"| {m} | {t} | {l} | {' / '.join(f'{x:.1f}' for x in v)} | {st.median(v):.1f} |")
    for name in ("decode.jsonl", "decode-static-cut-variant.jsonl"):
        path = HERE / "raw-2core" / name
        if path.exists():
            rows = {}
            for line in path.read_text().splitlines():
                d = json.loads(line)
                rows.setdefault((d["model"], d["label"]), []).append(d["avg_ts"])
            print(f"\n2-core decode, {name}:")
            for (m, l), v in sorted(rows.items()):
                print(f"| {m} | {l} | {' / '.join(f'{x:.1f}' for x in v)} | {st.median(v):.1f} |")
    (HERE / "cpu_prefill.svg").write_text(svg(data))
