#!/usr/bin/env python3
"""Tables of README.md and engine_vs_batch.svg from this record's raw folders.

  python3 chart.py

raw*/bench.jsonl: `hipfire bench --batch 1,4,8,16` rows of cb597eb ("base") and of the tree
("new"), as call.sh writes them: {"bin", "budget", "test", "ts"}.
raw-check2/sweep.log: gemv_gbs lines "k K cols C rows|tiled <format threads gemv read ratio prep>".
raw/serve-raw.jsonl: scripts/serve_load.py objects labelled "<server> c<streams>".
The SVG is written by hand (no plotting dependency).
"""
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def bench(folder):
    p = HERE / folder / "bench.jsonl"
    if not p.exists():
        return {}
    rows = {}
    for line in p.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            b = 1 if " x" not in d["test"] else int(d["test"].split(" x")[1])
            rows[(d["bin"], d["budget"], b)] = d["ts"]
    return rows


def bench_table(folder):
    rows = bench(folder)
    if not rows:
        return ""
    out = [f"{folder}: engine tok/s, `bench --batch` (tg32 x B)",
           "| layers on the GPU | B | cb597eb | this tree | ratio | this tree ÷ its B = 1 |",
           "|---|---|---|---|---|---|"]
    for budget in sorted({k[1] for k in rows}, reverse=True):
        one = rows.get(("new", budget, 1))
        for b in sorted({k[2] for k in rows if k[1] == budget}):
            base, new = rows.get(("base", budget, b)), rows.get(("new", budget, b))
            if base and new:
                out.append(f"| {budget} of 32 | {b} | {base:.1f} | {new:.1f} | {new / base:.2f} | "
                           f"{new / one:.2f} |")
    return "\n".join(out)


def sweep_table():
    p = HERE / "raw-check2" / "sweep.log"
    if not p.exists():
        return ""
    got = {}
    for line in p.read_text().splitlines():
        f = line.split()
        if len(f) >= 9 and f[0] == "k":
            got[(int(f[1]), int(f[3]), f[4])] = float(f[7])
    out = ["CPU Q4_K multi-activation GEMV, 16 threads, DRAM-fed (GB/s of weights)",
           "| k | activations | lane-per-weight | tiled | tiled ÷ lane-per-weight |", "|---|---|---|---|---|"]
    for k, c in sorted({(k, c) for k, c, _ in got}):
        r, t = got.get((k, c, "rows")), got.get((k, c, "tiled"))
        if r and t:
            out.append(f"| {k} | {c} | {r:.1f} | {t:.1f} | {t / r:.2f} |")
    return "\n".join(out)


def serve_table():
    p = HERE / "raw" / "serve-raw.jsonl"
    if not p.exists():
        return ""
    rows = {}
    for line in p.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            server, c = d["label"].rsplit(" c", 1)
            rows[(server, int(c))] = d
    out = ["| streams | hipfire tok/s | llama-server tok/s | ratio | hipfire TTFT p50 / p99 ms | "
           "llama-server TTFT p50 / p99 ms | hipfire ITL p50 / p99 ms | llama-server ITL p50 / p99 ms |",
           "|---|---|---|---|---|---|---|---|"]
    for c in sorted({c for _, c in rows}):
        h, l = rows.get(("hipfire", c)), rows.get(("llama-server", c))
        if not h or not l:
            continue
        out.append(
            f"| {c} | {h['aggregate_tok_per_s']:.1f} | {l['aggregate_tok_per_s']:.1f} | "
            f"{h['aggregate_tok_per_s'] / l['aggregate_tok_per_s']:.2f} | "
            f"{h['ttft_ms_p50']:.0f} / {h['ttft_ms_p99']:.0f} | {l['ttft_ms_p50']:.0f} / {l['ttft_ms_p99']:.0f} | "
            f"{h['itl_ms_p50']:.1f} / {h['itl_ms_p99']:.1f} | {l['itl_ms_p50']:.1f} / {l['itl_ms_p99']:.1f} |")
    one = rows.get(("hipfire", 1))
    for c in sorted({c for _, c in rows}):
        h = rows.get(("hipfire", c))
        if one and h and c > 1:
            out.append(f"\nhipfire {c} streams ÷ 1 stream: "
                       f"{h['aggregate_tok_per_s'] / one['aggregate_tok_per_s']:.2f}")
    out.append(f"\nerrors over all runs: {sum(d['errors'] for d in rows.values())}")
    return "\n".join(out)


def svg(rows, path):
    w, h, pad = 520, 320, 55
    lines = [(("base", 32), "#9ecae1", "cb597eb, all resident"), (("new", 32), "#08519c", "this tree, all resident"),
             (("base", 16), "#fcae91", "cb597eb, 16 spilled"), (("new", 16), "#a50f15", "this tree, 16 spilled")]
    bs = sorted({k[2] for k in rows})
    top = max(rows.values()) * 1.1
    x = lambda b: pad + (w - 2 * pad) * bs.index(b) / max(1, len(bs) - 1)
    y = lambda v: h - pad - (h - 2 * pad) * v / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">sequences a batched step (B)</text>',
             f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" text-anchor="middle">engine tok/s</text>']
    for b in bs:
        parts.append(f'<text x="{x(b)}" y="{h - pad + 14}" text-anchor="middle">{b}</text>')
    for i in range(5):
        v = top * i / 4
        parts.append(f'<text x="{pad - 6}" y="{y(v) + 4}" text-anchor="end">{v:.0f}</text>')
    for li, ((tag, budget), colour, name) in enumerate(lines):
        pts = [(x(b), y(rows[(tag, budget, b)])) for b in bs if (tag, budget, b) in rows]
        if pts:
            parts.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
                colour, " ".join(f"{a:.1f},{c:.1f}" for a, c in pts)))
            parts.append(f'<text x="{pad + 8}" y="{pad + 14 * li}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    for folder in ["raw-check1", "raw-check2", "raw"]:
        t = bench_table(folder)
        if t:
            print(t + "\n")
    print(sweep_table() + "\n")
    print(serve_table())
    rows = bench("raw") or bench("raw-check2")
    if rows:
        svg(rows, HERE / "engine_vs_batch.svg")
