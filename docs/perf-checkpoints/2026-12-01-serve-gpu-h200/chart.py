#!/usr/bin/env python3
"""Table of README.md and aggregate_vs_streams.svg from this record's raw files.

  python3 chart.py [RAW_DIR]   # default: raw/ (serve-raw.jsonl from run.sh, bench-16-passback.json)

serve-raw.jsonl: one scripts/serve_load.py object per line, labelled "<server> c<streams>".
bench-16-passback.json: `hipfire bench --batch 1,4,8,16 --json` rows (engine time only, no HTTP).
The SVG is written by hand (no plotting dependency): aggregate tok/s against streams per server.
"""
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
RAW = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "raw"


def serve_rows():
    rows = {}
    for line in (RAW / "serve-raw.jsonl").read_text().splitlines():
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


def bench_table():
    p = RAW / "bench-16-passback.json"
    if not p.exists():
        return ""
    rows = json.loads(p.read_text())
    lines = ["| test | tok/s (mean ± sd) |", "|---|---|"]
    for r in rows:
        lines.append(f"| {r['test']} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} |")
    return "\n".join(lines)


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
    rows = serve_rows()
    print(table(rows))
    print()
    print(bench_table())
    svg(rows, HERE / "aggregate_vs_streams.svg")
