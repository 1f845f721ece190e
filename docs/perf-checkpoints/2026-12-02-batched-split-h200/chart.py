#!/usr/bin/env python3
"""Tables of README.md and aggregate_vs_streams.svg from this record's raw folders.

  python3 chart.py   # every raw*/ folder here; the chart from raw/ (or raw-serve1/)

serve-raw.jsonl: one scripts/serve_load.py object per line, labelled "<server> c<streams>".
bench.jsonl: `hipfire bench --batch 1,4,8,16 --json` rows of the previous main ("base") and of
the tree ("new"), interleaved by round (engine time only, no HTTP).
The SVG is written by hand (no plotting dependency): aggregate tok/s against streams per server.
"""
import collections
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def serve_rows(raw):
    rows = {}
    for line in (raw / "serve-raw.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        server, c = d["label"].rsplit(" c", 1)
        rows[(server, int(c))] = d
    return rows


def table(rows):
    streams = sorted({c for _, c in rows})
    out = ["| streams | hipfire tok/s | llama-server tok/s | ratio | hipfire TTFT p50 / p99 ms | "
           "llama-server TTFT p50 / p99 ms | hipfire ITL p50 / p99 ms | llama-server ITL p50 / p99 ms |",
           "|---|---|---|---|---|---|---|---|"]
    for c in streams:
        h, l = rows.get(("hipfire", c)), rows.get(("llama-server", c))
        if not h or not l:
            continue
        out.append(
            f"| {c} | {h['aggregate_tok_per_s']:.1f} | {l['aggregate_tok_per_s']:.1f} | "
            f"{h['aggregate_tok_per_s'] / l['aggregate_tok_per_s']:.2f} | "
            f"{h['ttft_ms_p50']:.0f} / {h['ttft_ms_p99']:.0f} | {l['ttft_ms_p50']:.0f} / {l['ttft_ms_p99']:.0f} | "
            f"{h['itl_ms_p50']:.1f} / {h['itl_ms_p99']:.1f} | {l['itl_ms_p50']:.1f} / {l['itl_ms_p99']:.1f} |")
    one = rows.get(("hipfire", 1))
    for c in streams:
        h = rows.get(("hipfire", c))
        if one and h and c > 1:
            out.append(f"\nhipfire {c} streams / 1 stream: "
                       f"{h['aggregate_tok_per_s'] / one['aggregate_tok_per_s']:.2f}")
    errors = sum(d["errors"] for d in rows.values())
    out.append(f"\nerrors over all runs: {errors}")
    return "\n".join(out)


def bench_table(raw):
    p = raw / "bench.jsonl"
    if not p.exists():
        return ""
    runs = collections.defaultdict(dict)
    for line in p.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            runs[d["test"]][(d["bin"], d["round"])] = d["ts"]
    rounds = sorted({r for v in runs.values() for _, r in v})
    cols = [(b, r) for r in rounds for b in ("base", "new")]
    out = ["| test | " + " | ".join(f"{b} r{r}" for b, r in cols) + " | new / base (mean) |",
           "|---|" + "---|" * (len(cols) + 1)]
    for test, v in runs.items():
        base = [v[c] for c in cols if c[0] == "base" and c in v]
        new = [v[c] for c in cols if c[0] == "new" and c in v]
        ratio = (sum(new) / len(new)) / (sum(base) / len(base)) if base and new else float("nan")
        cells = " | ".join(f"{v[c]:.1f}" if c in v else "—" for c in cols)
        out.append(f"| {test} | {cells} | {ratio:.2f} |")
    return "\n".join(out)


def svg(rows, path):
    w, h, pad = 480, 300, 50
    servers = [("hipfire", "#d62728"), ("llama-server", "#1f77b4")]
    streams = sorted({c for _, c in rows})
    top = max(d["aggregate_tok_per_s"] for d in rows.values()) * 1.1
    x = lambda c: pad + (w - 2 * pad) * streams.index(c) / max(1, len(streams) - 1)
    y = lambda v: h - pad - (h - 2 * pad) * v / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">concurrent streams</text>',
             f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" text-anchor="middle">aggregate tok/s</text>']
    for c in streams:
        parts.append(f'<text x="{x(c)}" y="{h - pad + 14}" text-anchor="middle">{c}</text>')
    for i in range(5):
        v = top * i / 4
        parts.append(f'<text x="{pad - 4}" y="{y(v) + 4}" text-anchor="end">{v:.0f}</text>')
    for k, (name, color) in enumerate(servers):
        pts = [(x(c), y(rows[(name, c)]["aggregate_tok_per_s"])) for c in streams if (name, c) in rows]
        parts.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
            color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        parts.append(f'<text x="{pad + 10}" y="{pad + 14 * k}" fill="{color}">{name}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    chart = None
    for raw in sorted(HERE.glob("raw*/")):
        print(f"## {raw.name}\n")
        if (raw / "serve-raw.jsonl").exists():
            rows = serve_rows(raw)
            print(table(rows))
            print()
            if raw.name == "raw" or chart is None:
                chart = rows
        print(bench_table(raw))
        print()
    if chart:
        svg(chart, HERE / "aggregate_vs_streams.svg")
